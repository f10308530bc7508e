/*
 * fakeverbs_locked.c — see fakeverbs_locked.h. A test helper: the mutex stands in for the
 * single owner the double expects (a real NIC has its own concurrency; the double has none).
 */
#ifdef KVP_HAVE_VERBS

#include "tests/lib/fakeverbs_locked.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* fakeverbs_shared.c: with a shared arena the lock is its robust, process-shared mutex */
pthread_mutex_t *fvi_shared_lock(void);
void fvi_shared_lock_take(pthread_mutex_t *m);

void fv_lock(void)
{
    pthread_mutex_t *m = fvi_shared_lock();
    if (m)
        fvi_shared_lock_take(m);
    else
        pthread_mutex_lock(&g_mu);
}
void fv_unlock(void)
{
    pthread_mutex_t *m = fvi_shared_lock();
    pthread_mutex_unlock(m ? m : &g_mu);
}

/* ops first: get/free_device_list get the locked table and find the node's own from it. */
struct locked {
    struct kvp_verbs_ops ops;
    const struct kvp_verbs_ops *in;
};
static struct locked g_tab[8];
static int g_n;
/* Every function but the device list ones dispatches on its object, the same in every node's
 * table: any inner table serves them. */
static const struct kvp_verbs_ops *g_any;

#define IN(t) (((const struct locked *)(t))->in)
#define L(expr)                                                                                    \
    do {                                                                                           \
        fv_lock();                                                                                 \
        __typeof__(expr) r_ = (expr);                                                              \
        fv_unlock();                                                                               \
        return r_;                                                                                 \
    } while (0)
#define LV(expr)                                                                                   \
    do {                                                                                           \
        fv_lock();                                                                                 \
        expr;                                                                                      \
        fv_unlock();                                                                               \
    } while (0)

static struct ibv_device **l_get_device_list(const struct kvp_verbs_ops *o, int *num)
{
    L(IN(o)->get_device_list(IN(o), num));
}
static void l_free_device_list(const struct kvp_verbs_ops *o, struct ibv_device **list)
{
    LV(IN(o)->free_device_list(IN(o), list));
}
static const char *l_get_device_name(struct ibv_device *d) { L(g_any->get_device_name(d)); }
static struct ibv_context *l_open_device(struct ibv_device *d) { L(g_any->open_device(d)); }
static int l_close_device(struct ibv_context *c) { L(g_any->close_device(c)); }
static int l_query_device(struct ibv_context *c, struct ibv_device_attr *a) { L(g_any->query_device(c, a)); }
static int l_query_port(struct ibv_context *c, uint8_t p, struct ibv_port_attr *a)
{
    L(g_any->query_port(c, p, a));
}
static int l_query_gid(struct ibv_context *c, uint8_t p, int i, union ibv_gid *g)
{
    L(g_any->query_gid(c, p, i, g));
}
static int l_query_gid_ex(struct ibv_context *c, uint32_t p, uint32_t i, struct ibv_gid_entry *e,
                          uint32_t f)
{
    L(g_any->query_gid_ex(c, p, i, e, f));
}
static int l_get_async_event(struct ibv_context *c, struct ibv_async_event *e)
{
    L(g_any->get_async_event(c, e));
}
static void l_ack_async_event(struct ibv_async_event *e) { LV(g_any->ack_async_event(e)); }
static struct ibv_pd *l_alloc_pd(struct ibv_context *c) { L(g_any->alloc_pd(c)); }
static int l_dealloc_pd(struct ibv_pd *p) { L(g_any->dealloc_pd(p)); }
static struct ibv_mr *l_reg_mr(struct ibv_pd *p, void *a, size_t n, int acc) { L(g_any->reg_mr(p, a, n, acc)); }
static struct ibv_mr *l_reg_dmabuf_mr(struct ibv_pd *p, uint64_t off, size_t n, uint64_t iova, int fd, int acc)
{
    L(g_any->reg_dmabuf_mr(p, off, n, iova, fd, acc));
}
static int l_dereg_mr(struct ibv_mr *m) { L(g_any->dereg_mr(m)); }
static struct ibv_comp_channel *l_create_comp_channel(struct ibv_context *c)
{
    L(g_any->create_comp_channel(c));
}
static int l_destroy_comp_channel(struct ibv_comp_channel *ch) { L(g_any->destroy_comp_channel(ch)); }
static struct ibv_cq *l_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch,
                                  int v)
{
    L(g_any->create_cq(c, cqe, ctx, ch, v));
}
static int l_destroy_cq(struct ibv_cq *cq) { L(g_any->destroy_cq(cq)); }
static int l_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { L(g_any->poll_cq(cq, n, wc)); }
static int l_req_notify_cq(struct ibv_cq *cq, int s) { L(g_any->req_notify_cq(cq, s)); }
static int l_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx)
{
    L(g_any->get_cq_event(ch, cq, ctx));
}
static void l_ack_cq_events(struct ibv_cq *cq, unsigned int n) { LV(g_any->ack_cq_events(cq, n)); }
static struct ibv_qp *l_create_qp(struct ibv_pd *p, struct ibv_qp_init_attr *i) { L(g_any->create_qp(p, i)); }
static int l_modify_qp(struct ibv_qp *q, struct ibv_qp_attr *a, int m) { L(g_any->modify_qp(q, a, m)); }
static int l_query_qp(struct ibv_qp *q, struct ibv_qp_attr *a, int m, struct ibv_qp_init_attr *i)
{
    L(g_any->query_qp(q, a, m, i));
}
static int l_destroy_qp(struct ibv_qp *q) { L(g_any->destroy_qp(q)); }
static int l_post_send(struct ibv_qp *q, struct ibv_send_wr *w, struct ibv_send_wr **b)
{
    L(g_any->post_send(q, w, b));
}
static int l_post_recv(struct ibv_qp *q, struct ibv_recv_wr *w, struct ibv_recv_wr **b)
{
    L(g_any->post_recv(q, w, b));
}

const struct kvp_verbs_ops *fv_locked_ops(struct fv_node *n)
{
    if (g_n == 8)
        abort(); /* test helper: more nodes than it holds */
    struct locked *t = &g_tab[g_n++];
    t->in = fv_node_ops(n);
    g_any = t->in;
    t->ops = (struct kvp_verbs_ops){
        .impl = t->in->impl,
        .get_device_list = l_get_device_list, .free_device_list = l_free_device_list,
        .get_device_name = l_get_device_name, .open_device = l_open_device,
        .close_device = l_close_device, .query_device = l_query_device, .query_port = l_query_port,
        .query_gid = l_query_gid, .query_gid_ex = l_query_gid_ex,
        .get_async_event = l_get_async_event, .ack_async_event = l_ack_async_event,
        .alloc_pd = l_alloc_pd, .dealloc_pd = l_dealloc_pd, .reg_mr = l_reg_mr,
        .reg_dmabuf_mr = l_reg_dmabuf_mr, .dereg_mr = l_dereg_mr,
        .create_comp_channel = l_create_comp_channel, .destroy_comp_channel = l_destroy_comp_channel,
        .create_cq = l_create_cq, .destroy_cq = l_destroy_cq, .poll_cq = l_poll_cq,
        .req_notify_cq = l_req_notify_cq, .get_cq_event = l_get_cq_event,
        .ack_cq_events = l_ack_cq_events, .create_qp = l_create_qp, .modify_qp = l_modify_qp,
        .query_qp = l_query_qp, .destroy_qp = l_destroy_qp, .post_send = l_post_send,
        .post_recv = l_post_recv};
    return &t->ops;
}

static uint64_t env_now(void *a) { L(fv_now(a)); }
static void env_wait(void *a, uint64_t ns) { LV(fv_advance(a, ns ? ns : 1000)); }

struct kvp_rdma_env fv_locked_env(struct fv_fabric *f)
{
    return (struct kvp_rdma_env){.now_ns = env_now, .wait = env_wait, .arg = f};
}

void fv_locked_reset(void)
{
    g_n = 0;
    g_any = NULL;
}

#endif
