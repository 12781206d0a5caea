/* The rows of the operator's request table (kube_requests.h), looked up by id. */
#include "kube_requests.h"

#define PL_REQ_ROW_(id, group, resource, verb) [PL_REQ_##id] = {group, resource, verb},
const pl_kube_req_row pl_kube_req_rows[PL_REQ_COUNT] = {PL_KUBE_REQUESTS(PL_REQ_ROW_)};
#undef PL_REQ_ROW_
