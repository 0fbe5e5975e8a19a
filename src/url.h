/*
 * url.h
 *		HTTP tasks' URLs (url.c): one normal form, and whether
 *		dwarf.http_allow allows it.  Used where define checks an HTTP task
 *		(graph.c), where the HTTP process calls it (http.c), and by the
 *		setting's check.
 */
#ifndef DWARF_URL_H
#define DWARF_URL_H

#include "utils/guc.h"

#include "dwarf.h"

/* The longest URL an HTTP task may call. */
#define DWARF_MAX_URL	2048

extern char *UrlNormalize(const char *url, const char **why);
extern bool UrlAllowed(const char *normal);
extern bool UrlCheckAllow(char **newval, void **extra, GucSource source);

#endif							/* DWARF_URL_H */
