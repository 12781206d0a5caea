/* The dashboard's page: operator/runtime/dashboard/page.html with page.css and page.js
 * inlined, made a C string at build time by tools/embed_page.py (build/gen/). The page
 * holds PL_DASHBOARD_PAGE_MARK once, where a static history may be inserted
 * (pl_dashboard_write_static). Constant; any thread may read it. */
#ifndef PLIANT_DASHBOARD_PAGE_H
#define PLIANT_DASHBOARD_PAGE_H

#include <stddef.h>

#define PL_DASHBOARD_PAGE_MARK "<!--pliant-history-->"

extern const char pl_dashboard_page[];
extern const size_t pl_dashboard_page_len;

#endif
