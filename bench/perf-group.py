# Groups a perf profile of dwarf workers (recorded with --call-graph dwarf, so
# that frames of the stripped postgres binary unwind) by what the samples
# were doing: each sample goes to the first group, in the order below, whose
# functions are on its stack.  Static functions of postgres have no symbol:
# as leaves they are named by their first named caller.
#   perf script -i perf.data -F comm,pid,ip,sym,dso > p.script
#   python3 bench/perf-group.py p.script [--leaf] [--below FUNC GROUP|'*'] [--callers FUNC]
import sys, re, collections
samples = []
cur = None
for line in open(sys.argv[1]):
    line = line.rstrip('\n')
    if not line.strip():
        if cur is not None: samples.append(cur); cur = None
        continue
    if not line.startswith('\t') and not line.startswith(' '):
        cur = []; continue
    m = re.match(r'\s+([0-9a-f]+) (.*) \((.*)\)$', line)
    if m and cur is not None:
        cur.append((m.group(2), m.group(3).split('/')[-1], m.group(1)))
if cur: samples.append(cur)
N = len(samples)
def name(f):
    s, dso, addr = f
    if s == '[unknown]': return '%s+0x%s' % (dso, addr)
    return s
# self (leaf) with static-symbol resolution: the first known caller
leaf = collections.Counter()
for s in samples:
    if not s: continue
    if s[0][0] == '[unknown]':
        caller = next((f[0] for f in s[1:] if f[0] != '[unknown]'), '?')
        leaf['(static in %s, under %s)' % (s[0][1], caller)] += 1
    else:
        leaf[s[0][0]] += 1
idle = sum(1 for s in samples if s and any(f[0] in ('epoll_wait','WaitLatch','WaitEventSetWait') for f in s[:6]))
print('samples', N, 'idle(wait)', idle)
if '--leaf' in sys.argv:
    for k, v in leaf.most_common(45): print('%6.2f%%  %s' % (100.0*v/N, k))
MEM = {'palloc','palloc0','pfree','AllocSetAlloc','AllocSetFree','AllocSetReset','AllocSetDelete','AllocSetContextCreateInternal',
       'MemoryContextAlloc','MemoryContextAllocZero','MemoryContextAllocZeroAligned','MemoryContextAllocExtended','MemoryContextDelete',
       'MemoryContextReset','MemoryContextResetOnly','MemoryContextDeleteChildren','MemoryContextCallResetCallbacks','MemoryContextCreate',
       '_int_malloc','_int_free','malloc','free','unlink_chunk.constprop.0','repalloc','AllocSetRealloc','__libc_malloc','__libc_free',
       'cfree@GLIBC_2.2.5','malloc_consolidate','MemoryContextSetParent','_int_free_merge_chunk','_int_free_create_chunk','tcache_get','__memset_avx512_unaligned_erms','MemoryContextStrdup','pstrdup'}
def has(s, names): return any(f[0] in names for f in s)
def group(s):
    fs = [f[0] for f in s]
    st = set(fs)
    if {'epoll_wait','WaitEventSetWait'} & set(fs[:6]): return 'idle: waiting on the latch'
    if 'jit_compile_expr' in st or any(f.startswith('llvm') or f.startswith('LLVM') for f in fs): return 'JIT (llvmjit) of the worker\'s own load queries'
    if {'CommitTransactionCommand','CommitTransaction'} & st:
        if 'XLogFlush' in st: return 'commit: XLogFlush (WAL write + fdatasync)'
        return 'commit: the rest (locks, buffers, invalidations, resource owners)'
    if 'LoadAndQueue' in st or 'LoadFlows' in st: return 'load/replay flows (LoadFlows: notes, SPI reads of flow and step rows, replay)'
    if 'WriteClose' in st or 'RowsCloseFlow' in st: return 'flow close (WriteClose -> RowsCloseFlow: index fetch + heap_update)'
    if 'RecordStep' in st:
        if {'ExecInsertIndexTuples','btinsert'} & st: return 'step row: index insert (step_pkey, step_step_id)'
        if 'heap_insert' in st:
            if {'XLogInsert','XLogInsertRecord'} & st: return 'step row: heap_insert WAL record'
            if 'RelationGetBufferForTuple' in st: return 'step row: heap_insert finding/extending a page'
            return 'step row: heap_insert (rest)'
        if {'heap_form_tuple','ExecFetchSlotHeapTuple','tts_virtual_copy_heap_tuple','heap_fill_tuple','heap_compute_data_size_ext'} & st: return 'step row: forming the tuple'
        return 'step row: RecordStep rest (Datums, jsonb of changes, constraint check)'
    if 'fmgr_sql' in st:
        if {'init_sql_fcache','pg_parse_query','raw_parser','pg_analyze_and_rewrite_fixedparams','pg_analyze_and_rewrite_withcb','pg_plan_queries','pg_plan_query','planner','standard_planner','check_sql_fn_retval','prepare_sql_fn_parse_info','pg_rewrite_query','parse_analyze_fixedparams','pg_analyze_and_rewrite_varparams'} & st:
            return 'task call: SQL function parse/analyze/plan (init_sql_fcache, every call)'
        if {'postquel_start','CreateQueryDesc','ExecutorStart','standard_ExecutorStart'} & st: return 'task call: SQL function executor start'
        if {'postquel_getnext','ExecutorRun','standard_ExecutorRun'} & st: return 'task call: SQL function execute'
        if {'postquel_end','ExecutorEnd','standard_ExecutorEnd','ExecutorFinish'} & st: return 'task call: SQL function executor end'
        return 'task call: fmgr_sql rest'
    if {'NewGUCNestLevel','AtEOXact_GUC','set_config_option','set_config_option_ext','ProcessGUCArray','assign_search_path','recomputeNamespacePath','SetUserIdAndSecContext','GetUserIdAndSecContext','ApplySetting','process_settings','SessionServe'} & st:
        return 'GUC nest / search_path / role per step'
    if {'FlowAdvance','MergeChanges'} & st or any('Merge' in f or 'jsonb' in f.lower() or 'Jsonb' in f for f in fs[:12]):
        return 'advance: merge changes into state (jsonb) + transitions'
    if {'NewStepSnapshot','GetSnapshotData','GetLatestSnapshot','GetTransactionSnapshot','CommandCounterIncrement'} & st: return 'step snapshot + CommandCounterIncrement'
    if {'BeginInternalSubTransaction','ReleaseCurrentSubTransaction','RollbackAndReleaseCurrentSubTransaction'} & st: return 'subtransactions'
    if {'StartTransactionCommand','StartTransaction'} & st: return 'transaction start'
    if 'RunStep' in st: return 'RunStep: the rest (outcome, bookkeeping)'
    if 'RunEntries' in st or 'RunBatch' in st: return 'RunEntries/RunBatch: the rest (queue pops, batch bookkeeping)'
    return 'other: ' + next((f for f in fs if f != '[unknown]'), '?')
g = collections.Counter(group(s) for s in samples if s)
mem = collections.Counter(group(s) for s in samples if s and s[0][0] in MEM)
busy = N - idle
print('busy samples', busy)
for k, v in sorted(g.items(), key=lambda kv: -kv[1]):
    print('%6.1f%% of busy  (%4d)  mem-alloc leaf %5.1f%%  %s' % (100.0*v/busy if 'idle' not in k else 0, v, 100.0*mem[k]/busy, k))
print('memory allocation as leaf, all groups: %.1f%%' % (100.0*sum(mem.values())/busy))
if '--below' in sys.argv:
    tgt = sys.argv[sys.argv.index('--below') + 1]
    filt = sys.argv[sys.argv.index('--below') + 2]
    c = collections.Counter()
    for s in samples:
        if not s or group(s) != filt and filt != '*': continue
        fs = [f[0] for f in s]
        if tgt not in fs: continue
        i = fs.index(tgt)
        below = [f for f in fs[:i] if f != '[unknown]' and '(inlined)' not in f]
        c[' <- '.join(reversed(below[-3:])) if below else '(self)'] += 1
    for k, v in c.most_common(25): print('%6.2f%%  %s' % (100.0*v/busy, k))
if '--callers' in sys.argv:
    tgt = sys.argv[sys.argv.index('--callers') + 1]
    c = collections.Counter()
    for s in samples:
        if not s or s[0][0] != tgt: continue
        up = [f[0] for f in s[1:] if f[0] != '[unknown]' and '(inlined)' not in f[0]]
        c[' <- '.join(up[:2])] += 1
    for k, v in c.most_common(12): print('%6.2f%%  %s' % (100.0*v/busy, k))
