/* Every Kubernetes API request pliant-operator makes, one row each: its API group
 * ("" for the core group), resource and RBAC verb. Each call site names its row
 * (API() in the controller's files, PL_REQ elsewhere), so that a request missing here does not
 * compile; tests/cli/test_chart.py reads this table, checks that every call site names
 * a row whose verb fits the call, and that the chart's RBAC grants every row and
 * nothing else. Rows are written one per line: X(ID, group, resource, verb). */
#ifndef PLIANT_KUBE_REQUESTS_H
#define PLIANT_KUBE_REQUESTS_H

#define PL_KUBE_REQUESTS(X)                                                                        \
    X(JOB_LIST, "pliant.dev", "trainingjobs", "list")           /* the TrainingJob informer */    \
    X(JOB_WATCH, "pliant.dev", "trainingjobs", "watch")                                            \
    X(JOB_DELETE, "pliant.dev", "trainingjobs", "delete")       /* ttlSecondsAfterFinished */     \
    X(JOB_STATUS_PATCH, "pliant.dev", "trainingjobs/status", "patch")                              \
    X(JOB_FINALIZERS_UPDATE, "pliant.dev", "trainingjobs/finalizers", "update") /* owner refs */  \
    X(POD_LIST, "", "pods", "list")                             /* the worker Pod informer */     \
    X(POD_WATCH, "", "pods", "watch")                                                              \
    X(POD_CREATE, "", "pods", "create")                                                            \
    X(POD_DELETE, "", "pods", "delete")    /* clean-up, suspend, finished Pods beyond the last */ \
    X(SECRET_GET, "", "secrets", "get")    /* a new leader reads the job's credentials */        \
    X(SECRET_CREATE, "", "secrets", "create")                                                      \
    X(SERVICE_GET, "", "services", "get")  /* a new leader reads the job's port */               \
    X(SERVICE_CREATE, "", "services", "create")                                                    \
    X(SLICE_CREATE, "discovery.k8s.io", "endpointslices", "create")                                \
    X(SLICE_PATCH, "discovery.k8s.io", "endpointslices", "patch") /* a new leader's address */   \
    X(POLICY_CREATE, "networking.k8s.io", "networkpolicies", "create")                             \
    X(EVENT_CREATE, "events.k8s.io", "events", "create")                                           \
    X(NODE_GET, "", "nodes", "get")        /* zones and host names */                            \
    X(LEASE_GET, "coordination.k8s.io", "leases", "get")       /* leader election */             \
    X(LEASE_CREATE, "coordination.k8s.io", "leases", "create")                                     \
    X(LEASE_UPDATE, "coordination.k8s.io", "leases", "update")

#define PL_REQ_ENUM_(id, group, resource, verb) PL_REQ_##id,
typedef enum { PL_KUBE_REQUESTS(PL_REQ_ENUM_) PL_REQ_COUNT } pl_kube_req;
#undef PL_REQ_ENUM_

/* The row of request id (group, resource, verb). */
typedef struct {
    const char *group, *resource, *verb;
} pl_kube_req_row;
extern const pl_kube_req_row pl_kube_req_rows[PL_REQ_COUNT];

/* A call that makes the request of row id: PL_REQ(LEASE_GET, pl_kube_get(...)). */
#define PL_REQ(id, call) ((void)PL_REQ_##id, (call))

#endif
