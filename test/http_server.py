#!/usr/bin/env python3
"""A small HTTP server for dwarf's HTTP task tests and bench (asyncio, one
thread, thousands of connections at once).  Loopback only: it binds
127.0.0.1 on a free port, which it writes to PORTFILE once it listens.

    http_server.py PORTFILE

What a path answers (the request's body is read and kept):
  /ok              200 {"called": n, "got": <the request's JSON body>}
  /echo            200 {"headers": {lower-case name: value}, "body": <its JSON>}
  /empty           200 with no body
  /array           200 [1, 2]
  /delay/MS        200 {"slept": MS} after MS milliseconds
  /hang/MS         200 {"slept": MS} after MS milliseconds, or nothing once the client closes
                   its connection, which it watches for: "closed" counts those, "closed_at"
                   keeps when (unix s) per path, and "overlaps" counts requests that came
                   while a connection with the same Idempotency-Key was still open here
  /fail/N[/S]      503 (Retry-After: S, default 0) for the first N requests of each Idempotency-Key, then
                   200 {"attempts": n} (with Retry-After: 0)
  /status/CODE     CODE with the body "status CODE here"
  /big/MB          200 with a body of MB megabytes
  /redirect        302 to /ok
  /stats           {"requests": n, "answered": n, "in_flight": n, "peak": n, "by_path": {...},
                    "keys": {path: [Idempotency-Key, ...]}}; not counted
  /counts          {"requests": n, "answered": n, "in_flight": n, "peak": n, "time": unix s}:
                   the counts alone, small enough to sample every second; not counted
  /reset           zeroes the counts; not counted
"""
import asyncio
import json
import sys
import time

# answered: requests whose whole answer was written (a call that ended)
stats = {"requests": 0, "answered": 0, "in_flight": 0, "peak": 0, "by_path": {}, "keys": {},
         "closed": 0, "closed_at": {}, "overlaps": 0}
fails = {}
open_keys = {}  # Idempotency-Key: connections open now (/hang)


def reset():
    stats.update(requests=0, answered=0, in_flight=0, peak=0, by_path={}, keys={},
                 closed=0, closed_at={}, overlaps=0)
    fails.clear()


async def answer(writer, status, body=b"", headers=None):
    reason = {200: "OK", 302: "Found", 404: "Not Found", 503: "Service Unavailable"}.get(status, "Status")
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}"]
    for k, v in (headers or {}).items():
        head.append(f"{k}: {v}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    if body:
        writer.write(body)
    await writer.drain()


async def handle(reader, writer):
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            method, target, _ = line.decode().split(" ", 2)
            headers = {}
            while True:
                h = await reader.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                k, v = h.decode().split(":", 1)
                headers[k.strip().lower()] = v.strip()
            body = b""
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            await route(reader, writer, method, target, headers, body)
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


async def hang(reader, writer, path, key, ms):
    """Answers after ms, unless the client closes the connection first."""
    if open_keys.get(key, 0) > 0:
        stats["overlaps"] += 1
    open_keys[key] = open_keys.get(key, 0) + 1
    try:
        await asyncio.wait_for(reader.read(1), ms / 1000)
        stats["closed"] += 1
        stats["closed_at"].setdefault(path, []).append(time.time())
        return False
    except asyncio.TimeoutError:
        await answer(writer, 200, json.dumps({"slept": ms}).encode())
        return True
    finally:
        open_keys[key] -= 1


async def route(reader, writer, method, path, headers, body):
    if path == "/stats":
        await answer(writer, 200, json.dumps(stats).encode())
        return
    if path == "/counts":
        counts = {k: stats[k] for k in ("requests", "answered", "in_flight", "peak")}
        counts["time"] = time.time()
        await answer(writer, 200, json.dumps(counts).encode())
        return
    if path == "/reset":
        reset()
        await answer(writer, 200, b"{}")
        return
    parts = path.strip("/").split("/")
    stats["requests"] += 1
    stats["by_path"][path] = stats["by_path"].get(path, 0) + 1
    stats["keys"].setdefault(path, []).append(headers.get("idempotency-key"))
    stats["in_flight"] += 1
    stats["peak"] = max(stats["peak"], stats["in_flight"])
    try:
        try:
            got = json.loads(body) if body else None
        except ValueError:
            got = body.decode(errors="replace")
        if parts[0] == "ok":
            await answer(writer, 200, json.dumps({"called": stats["by_path"][path], "got": got}).encode())
        elif parts[0] == "echo":
            await answer(writer, 200, json.dumps({"headers": headers, "body": got, "method": method}).encode())
        elif parts[0] == "empty":
            await answer(writer, 200)
        elif parts[0] == "array":
            await answer(writer, 200, b"[1, 2]")
        elif parts[0] == "delay":
            await asyncio.sleep(int(parts[1]) / 1000)
            await answer(writer, 200, json.dumps({"slept": int(parts[1])}).encode())
        elif parts[0] == "hang":
            if not await hang(reader, writer, path, headers.get("idempotency-key"), int(parts[1])):
                return
        elif parts[0] == "fail":
            key = (path, headers.get("idempotency-key"))
            fails[key] = fails.get(key, 0) + 1
            if fails[key] <= int(parts[1]):
                after = parts[2] if len(parts) > 2 else "0"
                await answer(writer, 503, b"busy, try again", {"Retry-After": after})
            else:
                await answer(writer, 200, json.dumps({"attempts": fails[key]}).encode())
        elif parts[0] == "status":
            code = int(parts[1])
            await answer(writer, code, f"status {code} here".encode())
        elif parts[0] == "big":
            await answer(writer, 200, b"[" + b"1," * (int(parts[1]) * 512 * 1024) + b"1]")
        elif parts[0] == "redirect":
            await answer(writer, 302, b"", {"Location": "/ok"})
        else:
            await answer(writer, 404, b"no such path")
        stats["answered"] += 1
    finally:
        stats["in_flight"] -= 1


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(port))
    import os
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
