/*
 * kvp_test_guard — the cluster guard (tests/lib/cluster_guard.h) for shell scripts and the
 * Python tests: `kvp_test_guard PID` starts a detached guard for process PID and prints the mark
 * to export before running `kvpoolctl cluster up`:
 *     export KVP_TEST_OWNER=$("$KVP_BUILD_DIR"/tests/kvp_test_guard $$)
 * When PID is gone, every process carrying KVP_TEST_OWNER=<that mark> is SIGKILLed.
 * Exit status 0, or 2 on a usage error, 1 when the guard could not start.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tests/lib/cluster_guard.h"

int main(int argc, char **argv)
{
    char *end = NULL;
    long pid = argc == 2 ? strtol(argv[1], &end, 10) : 0;
    if (argc != 2 || !end || *end != '\0' || pid <= 0) {
        fprintf(stderr, "usage: kvp_test_guard PID (the process whose daemons the guard stops)\n");
        return 2;
    }
    char token[32];
    if (kvp_test_guard_start((pid_t)pid, token, sizeof token) != 0)
        return 1;
    printf("%s\n", token);
    return 0;
}
