/*
 * err.c — kvp_strerror() and kvp_errname(), generated from KVP_ERR_LIST (include/kvpool.h),
 * the one list of error codes. Nothing here is kept in step by hand: a code added to the list
 * gets its name and text here.
 */
#include "kvpool.h"

struct err_entry {
    const char *name;
    const char *text;
};

/* Indexed by -code. */
#define ERR_ENTRY(name, value, text) [-(value)] = {#name, text},
static const struct err_entry err_table[] = {KVP_ERR_LIST(ERR_ENTRY)};
#undef ERR_ENTRY

/* The list is dense: codes 0, -1, ... with no gap, so -KVP_ERR__LAST entries fill the table. */
_Static_assert(sizeof err_table / sizeof err_table[0] == (unsigned)-KVP_ERR__LAST,
               "KVP_ERR_LIST must hold the codes 0 .. KVP_ERR__LAST+1 in order, without gaps");
#define ERR_CHECK_DENSE(name, value, text)                                                     \
    _Static_assert((value) <= 0 && (value) > KVP_ERR__LAST, #name " outside 0 .. KVP_ERR__LAST+1");
KVP_ERR_LIST(ERR_CHECK_DENSE)
#undef ERR_CHECK_DENSE

static const struct err_entry *lookup(int err)
{
    if (err > 0 || err <= KVP_ERR__LAST || !err_table[-err].name)
        return NULL;
    return &err_table[-err];
}

const char *kvp_strerror(int err)
{
    const struct err_entry *e = lookup(err);
    return e ? e->text : "unknown error";
}

const char *kvp_errname(int err)
{
    const struct err_entry *e = lookup(err);
    return e ? e->name : "KVP_ERR_UNKNOWN";
}
