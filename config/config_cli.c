/* config_cli.c — the shared start of the daemons' main(): see kvp_cfg_daemon_args(). */
#include <stdio.h>
#include <stdlib.h>

#include "config/config.h"
#include "kvpool.h"

int kvp_cfg_daemon_args(enum kvp_cfg_kind kind, void *cfg, const char *prog, int argc, char **argv)
{
    bool print = false;
    int pos[4], npos = 0;
    if (kvp_cfg_from_args(kind, cfg, argc, argv, &print, pos, 4, &npos) != KVP_OK) {
        fprintf(stderr, "%s: bad settings (see the line above; --help lists them)\n", prog);
        return 2;
    }
    if (npos > 0) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[pos[0]]);
        return 2;
    }
    if (print) {
        char *j = kvp_cfg_to_json(kind, cfg);
        if (!j)
            return 1;
        printf("%s\n", j);
        free(j);
        return 0;
    }
    return -1;
}
