/*
 * prom_check.h — a checker of the Prometheus text exposition format (0.0.4) for the metrics
 * tests, standing in for `promtool check metrics` where Debian's prometheus package is not
 * installed (its package starts a Prometheus server on install, so install-deps does not add
 * it). The tests also run promtool when it is found (PATH or $KVP_PROMTOOL).
 *
 * Checked: every line is a HELP, TYPE or other comment, blank, or a sample
 * `name{label="value",...} value [timestamp]`; names and label names are valid; label values
 * are quoted with only \\, \" and \n escapes; values parse as floats (+Inf, -Inf, NaN too);
 * TYPE and HELP appear at most once per family and TYPE before its samples; a family's samples
 * are contiguous; no series appears twice; counters end in _total (promtool's lint rule);
 * histograms have _bucket samples with an `le` label, non-decreasing, ending in le="+Inf"
 * equal to _count, and a _sum; every family starts with `prefix` when prefix is not NULL.
 */
#ifndef KVP_TEST_PROM_CHECK_H
#define KVP_TEST_PROM_CHECK_H

#include <stddef.h>

/** 0 when `text` is valid, else -1 with the first problem (and its line) in why. */
int kvp_test_prom_check(const char *text, const char *prefix, char *why, size_t why_cap);

/**
 * Run `promtool check metrics` on text when promtool is found ($KVP_PROMTOOL, else PATH).
 * Returns 0 (passed), 1 (failed: its output in why), or -1 (not found: nothing run).
 */
int kvp_test_promtool(const char *text, char *why, size_t why_cap);

/**
 * The value of the series `series` (name plus labels exactly as exposed, e.g.
 * `kvpool_master_rpcs_total{type="put_start",code="KVP_OK"}`) in text; -1 when absent.
 */
double kvp_test_prom_value(const char *text, const char *series);

#endif
