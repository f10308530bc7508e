/*
 * devrdma.h — the CUDA driver calls the rdma transport needs for GPU memory (issue 20;
 * ../shared/design/rdma.md §5), over the driver devmem.c loaded: the allocation range, a dma-buf
 * fd for it (cuMemGetHandleForAddressRange, DMA_BUF_FD, flags 0, after checking
 * CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED), whether the device needs cuFlushGPUDirectRDMAWrites
 * after READs land (GPU_DIRECT_RDMA_WRITES_ORDERING below OWNER and FLUSH_WRITES_OPTIONS has
 * HOST), and that flush in the device's primary context. Internal to the client library; built
 * only with libibverbs.
 */
#ifndef KVP_CLIENT_DEVRDMA_H
#define KVP_CLIENT_DEVRDMA_H

#include "actors/transfer/rdma/rdma_xport.h"

/**
 * Fill *out with the table over the loaded CUDA driver. Returns KVP_OK; KVP_ERR_UNSUPPORTED when
 * no driver is loaded or it lacks cuMemGetHandleForAddressRange / cuDeviceGetAttribute /
 * cuFlushGPUDirectRDMAWrites (GPU memory then goes through the staging path, devstage.h).
 */
int kvp_devrdma_cuda(struct kvp_rdma_cuda *out);

#endif
