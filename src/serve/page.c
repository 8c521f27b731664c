/* page.c: the web chat page (page.h). No external resources. */
#include "serve/page.h"

const char page_html[] =
    "<!doctype html><html><head><meta charset=\"utf-8\"><title>strata</title></head>"
    "<body><p>strata serve: POST /v1/chat/completions</p></body></html>\n";
