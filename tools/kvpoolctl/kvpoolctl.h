/*
 * kvpoolctl.h — pieces of the kvpoolctl operator CLI implemented in separate files.
 * tools/kvpoolctl/kvpoolctl.c (main, dispatch, cluster/segments commands) calls these.
 */
#ifndef KVP_TOOLS_KVPOOLCTL_H
#define KVP_TOOLS_KVPOOLCTL_H

#include <stdio.h>

/**
 * The data commands, over the public client API (include/kvpool.h):
 *   put KEY FILE|-        store the bytes of FILE (or stdin)
 *   get KEY [-o FILE|FILE] write the object to stdout or FILE (written whole, then renamed)
 *   exists KEY            exit 0 when the key exists, 1 when it does not, 2 on error
 *   rm KEY [--force]      remove (--force: also when under a read lease)
 *   size KEY              print the object's size in bytes
 * argv[0] is the subcommand (argc counts it). Flags anywhere after it:
 *   --masters host:port,...  --cluster DIR|DIR/cluster.json  --config FILE (client JSON)
 *   --replica-num N --soft-pin --preferred-segment NAME (put), -o/--output FILE (get),
 *   --force (rm), and any client config key as --key=value or --key value (docs/config.md).
 * Config layering: defaults < --config FILE < KVPOOL_* environment < flags.
 * Returns the process exit status: 0 success; 1 the operation failed (error printed with
 * kvp_strerror to stderr); 2 usage or config error, or no master reachable. `exists` returns
 * 0 / 1 / 2 as above. Blocking; call from main only.
 */
int kvpctl_data_main(int argc, char **argv);

/** Print the usage lines of the data commands to `out`. */
void kvpctl_data_usage(FILE *out);

#endif
