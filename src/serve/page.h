/* page.h: the web chat page served at GET / (one static HTML document). */
#ifndef STRATA_SERVE_PAGE_H
#define STRATA_SERVE_PAGE_H
extern const char page_html[];
#endif
