/* `pliant-operator`: the TrainingJob operator (operator/k8s/controller.h) with
 * leader election (leader.h: only the Lease holder reconciles and runs
 * coordinators; a replica that loses the Lease exits so that it restarts as a
 * candidate), /metrics on --metrics-addr and /healthz, /readyz on
 * --health-addr (probe_server.h), the jobs' dashboards on --dashboard-addr (served by
 * the leader; a follower answers 503 naming the Lease), its log filtered by --log-level
 * (oplog.h).
 * Defaults come from the Pod's environment the chart sets: POD_NAME (identity),
 * POD_NAMESPACE (the Lease's, and the operator's in the jobs' NetworkPolicies),
 * POD_IP (the endpoint of the jobs' coordinator Services), PLIANT_WORKER_IMAGE.
 * SIGTERM or SIGINT stops it cleanly (exit 0). */
#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "controller.h"
#include "dashboard.h"
#include "kube_config.h"
#include "leader.h"
#include "metrics.h"
#include "oplog.h"
#include "probe_server.h"

#define VERSION "pliant-operator 0.1 (control protocol 1, hello_resume)"

static atomic_int stop_flag;
static atomic_int leading, lost_lease;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stop_flag, 1);
}

/* pliant_leader: 1 while this replica leads. */
static void set_leader_gauge(pl_metrics *m, int on)
{
    pl_metrics_gauge_set(m, "pliant_leader", "1 while this replica leads", NULL, on);
}

static void on_started(void *user)
{
    atomic_store(&leading, 1);
    set_leader_gauge(user, 1);
}

static void on_stopped(void *user)
{
    set_leader_gauge(user, 0);
    if (!atomic_load(&leading)) return;
    atomic_store(&lost_lease, 1);
    atomic_store(&stop_flag, 1); /* the controller stops: another replica leads now */
}

typedef struct {
    pl_metrics *metrics;
    pl_controller *ctl;
    int leader_elect;
} probe_state;

static char *metrics_text(void *user)
{
    return pl_metrics_text(((probe_state *)user)->metrics);
}

/* Ready: a follower is (it waits for the Lease); a leader once its informers listed. */
static int ready(void *user)
{
    probe_state *p = user;
    if (p->leader_elect && !atomic_load(&leading)) return 1;
    return p->ctl && pl_controller_synced(p->ctl);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pliant-operator [--kubeconfig PATH] [--namespace NS] [--leader-elect]\n"
            "         [--lease-name NAME] [--lease-namespace NS] [--lease-duration S] [--identity ID]\n"
            "         [--metrics-addr HOST:PORT] [--health-addr HOST:PORT] [--dashboard-addr HOST:PORT]\n"
            "         [--coordinator-host HOST] [--coordinator-port BASE] [--bind-host HOST]\n"
            "         [--worker-image IMAGE] [--worker-command PATH]\n"
            "         [--advertise-address IP] [--job-network-policy] [--operator-namespace NS]\n"
            "         [--log-level error|warn|info|debug] [--version]\n"
            "  --kubeconfig: else $KUBECONFIG, the in-cluster service account, ~/.kube/config\n"
            "  --namespace: watch one namespace (default: all)\n"
            "  --metrics-addr, --health-addr: default :8080 and :8081; \"\" turns one off\n"
            "  --dashboard-addr: the leader serves each job's dashboard at /jobs/NS/NAME/ (default\n"
            "      off; HOST omitted: 127.0.0.1, as `pliant run --dashboard`)\n"
            "  --coordinator-host: the address worker Pods dial (default: in a Pod, each job's\n"
            "      Service, whose EndpointSlice the leader writes; else 127.0.0.1)\n"
            "  --advertise-address: this replica's IP in those EndpointSlices (default $POD_IP;\n"
            "      none: no EndpointSlice)\n"
            "  --job-network-policy: a NetworkPolicy per job: ingress to its worker Pods from\n"
            "      its own Pods and from operator Pods of --operator-namespace (default\n"
            "      $POD_NAMESPACE)\n"
            "  --log-level: messages at this level and above are written (default info)\n");
}

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

/* The command line, with the defaults the Pod's environment gives. */
typedef struct {
    const char *kubeconfig, *ns, *lease_name, *lease_ns, *metrics_addr, *health_addr,
        *dashboard_addr, *coord_host, *bind_host, *image, *command, *advertise, *operator_ns;
    char identity[256];
    int leader_elect, lease_s, port_base, network_policy;
} op_args;

static void default_args(op_args *a)
{
    *a = (op_args){.lease_name = "pliant-operator", .lease_ns = env_or("POD_NAMESPACE", NULL),
                   .metrics_addr = ":8080", .health_addr = ":8081", .dashboard_addr = "",
                   /* in a Pod: the jobs' Services (they follow the leader); else this host */
                   .coord_host = getenv("POD_NAME") ? NULL : "127.0.0.1",
                   .image = env_or("PLIANT_WORKER_IMAGE", NULL), .lease_s = 15,
                   .advertise = env_or("POD_IP", NULL),
                   .operator_ns = env_or("POD_NAMESPACE", NULL),
                   .port_base = atoi(env_or("PLIANT_COORDINATOR_PORT", "0"))};
    snprintf(a->identity, sizeof a->identity, "%s", env_or("POD_NAME", ""));
    if (!a->identity[0]) {
        char host[200] = "operator";
        gethostname(host, sizeof host - 1);
        snprintf(a->identity, sizeof a->identity, "%s-%d", host, (int)getpid());
    }
}

/* An option that only stores its value or sets a flag: 1, or 0 when c is another. */
static int store_option(int c, op_args *a)
{
    switch (c) {
    case 'k': a->kubeconfig = optarg; break;
    case 'n': a->ns = optarg; break;
    case 'l': a->leader_elect = 1; break;
    case 'L': a->lease_name = optarg; break;
    case 'N': a->lease_ns = optarg; break;
    case 'i': snprintf(a->identity, sizeof a->identity, "%s", optarg); break;
    case 'm': a->metrics_addr = optarg; break;
    case 'H': a->health_addr = optarg; break;
    case 'd': a->dashboard_addr = optarg; break;
    case 'c': a->coord_host = optarg; break;
    case 'b': a->bind_host = optarg; break;
    case 'I': a->image = optarg; break;
    case 'w': a->command = optarg; break;
    case 'P': a->port_base = atoi(optarg); break;
    case 'A': a->advertise = optarg[0] ? optarg : NULL; break;
    case 'p': a->network_policy = 1; break;
    case 'O': a->operator_ns = optarg; break;
    default: return 0;
    }
    return 1;
}

/* The other options: those whose value is checked (--log-level takes effect at once),
 * those that end the command and the unknown ones. The exit status when the command
 * ends here, else -1. */
static int checked_option(int c, op_args *a, char **argv)
{
    switch (c) {
    case 'v': {
        pl_log_level level;
        if (pl_log_parse_level(optarg, &level)) {
            pl_log(PL_LOG_ERROR, "--log-level: must be error, warn, info or debug (got %s)",
                   optarg);
            return 2;
        }
        pl_log_set_level(level);
        return -1;
    }
    case 'D':
        a->lease_s = atoi(optarg);
        if (a->lease_s < 2 || a->lease_s > 3600) {
            pl_log(PL_LOG_ERROR, "--lease-duration: seconds in 2..3600");
            return 2;
        }
        return -1;
    case 'V': puts(VERSION); return 0;
    case 'h': usage(stdout); return 0;
    default:
        pl_log(PL_LOG_ERROR, "unknown option or missing value: '%s'", argv[optind - 1]);
        usage(stderr);
        return 2;
    }
}

/* Fills a from argv; the exit status when the command ends here (--help,
 * --version, a usage error), else -1. */
static int parse_args(int argc, char **argv, op_args *a)
{
    static const struct option opts[] = {
        {"kubeconfig", required_argument, 0, 'k'},   {"namespace", required_argument, 0, 'n'},
        {"leader-elect", no_argument, 0, 'l'},        {"lease-name", required_argument, 0, 'L'},
        {"lease-namespace", required_argument, 0, 'N'}, {"identity", required_argument, 0, 'i'},
        {"metrics-addr", required_argument, 0, 'm'},  {"health-addr", required_argument, 0, 'H'},
        {"coordinator-host", required_argument, 0, 'c'}, {"bind-host", required_argument, 0, 'b'},
        {"worker-image", required_argument, 0, 'I'},  {"worker-command", required_argument, 0, 'w'},
        {"log-level", required_argument, 0, 'v'},     {"version", no_argument, 0, 'V'},
        {"lease-duration", required_argument, 0, 'D'},
        {"coordinator-port", required_argument, 0, 'P'},
        {"advertise-address", required_argument, 0, 'A'},
        {"job-network-policy", no_argument, 0, 'p'},
        {"operator-namespace", required_argument, 0, 'O'},
        {"dashboard-addr", required_argument, 0, 'd'},
        {"help", no_argument, 0, 'h'},                {0, 0, 0, 0}};
    default_args(a);
    int c, rc;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
        if (!store_option(c, a) && (rc = checked_option(c, a, argv)) >= 0)
            return rc;
    if (optind != argc) {
        pl_log(PL_LOG_ERROR, "unexpected argument '%s'", argv[optind]);
        return 2;
    }
    if (a->network_policy && !a->operator_ns) {
        pl_log(PL_LOG_ERROR, "--job-network-policy: needs --operator-namespace or $POD_NAMESPACE");
        return 2;
    }
    return -1;
}

static void catch_signals(void)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* With --leader-elect: campaigns for the Lease (*leader) and waits until this
 * replica leads or is stopped. Without, it leads at once. */
static int lead(const op_args *a, pl_kube_config *kc, pl_metrics *metrics, pl_leader **leader,
                char *err, size_t errlen)
{
    set_leader_gauge(metrics, !a->leader_elect);
    if (!a->leader_elect) {
        atomic_store(&leading, 1);
        return 0;
    }
    pl_leader_config lc = {.kc = kc, .namespace_ = a->lease_ns, .name = a->lease_name,
                           .identity = a->identity, .lease_ms = a->lease_s * 1000,
                           .renew_ms = a->lease_s * 2000 / 3, .retry_ms = a->lease_s * 2000 / 15,
                           .on_started = on_started, .on_stopped = on_stopped, .user = metrics};
    if (!(*leader = pl_leader_start(&lc, err, errlen))) return -1;
    while (!atomic_load(&stop_flag) && !atomic_load(&leading)) usleep(50 * 1000);
    if (atomic_load(&leading)) pl_log(PL_LOG_INFO, "%s leads", a->identity);
    return 0;
}

/* --dashboard-addr: the server, 503 naming the Lease until this replica leads. 0, or -1
 * and err. */
static int start_dashboard(const op_args *a, pl_dashboard **d, char *err, size_t errlen)
{
    if (!a->dashboard_addr[0]) return 0;
    if (!(*d = pl_dashboard_start("--dashboard-addr", a->dashboard_addr, err, errlen))) return -1;
    if (a->leader_elect) {
        char why[768];
        snprintf(why, sizeof why,
                 "%s does not lead: the dashboards are served by the holder of Lease %s/%s",
                 a->identity, a->lease_ns ? a->lease_ns : "default", a->lease_name);
        pl_dashboard_set_unavailable(*d, why);
    }
    return 0;
}

/* The controller, its probe servers and, once this replica leads, its loop
 * until stopped. The exit status. */
static int run(const op_args *a, pl_kube_config *kc)
{
    char err[1024] = "";
    int rc = 1;
    pl_metrics *metrics = pl_metrics_new();
    probe_state ps = {metrics, NULL, a->leader_elect};
    pl_probe_server *mp = NULL, *hp = NULL;
    pl_dashboard *dash = NULL;
    pl_leader *leader = NULL;
    if (start_dashboard(a, &dash, err, sizeof err)) goto done;
    pl_controller_config cc = {.kc = kc, .namespace_ = a->ns, .coordinator_host = a->coord_host,
                               .bind_host = a->bind_host, .port_base = a->port_base,
                               .worker_image = a->image, .worker_command = a->command,
                               .identity = a->identity, .metrics = metrics,
                               .advertise_ip = a->advertise, .network_policy = a->network_policy,
                               .operator_namespace = a->operator_ns, .dashboard = dash};
    if (!metrics || !(ps.ctl = pl_controller_new(&cc, err, sizeof err))) goto done;
    pl_probe_config mc = {.addr = a->metrics_addr, .metrics = metrics_text, .ready = ready,
                          .user = &ps};
    pl_probe_config hc = {.addr = a->health_addr, .ready = ready, .user = &ps};
    if ((a->metrics_addr[0] && !(mp = pl_probe_start(&mc, err, sizeof err))) ||
        (a->health_addr[0] && !(hp = pl_probe_start(&hc, err, sizeof err))))
        goto done;
    pl_log(PL_LOG_INFO,
           "%s, identity %s, workers dial %s, metrics port %d, health port %d, dashboard port %d",
           VERSION, a->identity, a->coord_host ? a->coord_host : "each job's Service",
           mp ? pl_probe_port(mp) : 0, hp ? pl_probe_port(hp) : 0,
           dash ? pl_dashboard_port(dash) : 0);
    if (lead(a, kc, metrics, &leader, err, sizeof err)) goto done;
    if (dash && atomic_load(&leading)) pl_dashboard_set_unavailable(dash, NULL);
    if (!atomic_load(&stop_flag) && pl_controller_run(ps.ctl, &stop_flag, err, sizeof err))
        goto done;
    rc = atomic_load(&lost_lease) ? 1 : 0;
    if (rc) snprintf(err, sizeof err, "lost the lease: exiting so that another replica leads");
done:
    if (rc && err[0]) pl_log(PL_LOG_ERROR, "%s", err);
    pl_controller_free(ps.ctl); /* removes its pages: before the dashboard stops */
    pl_leader_stop(leader);
    pl_dashboard_stop(dash);
    pl_probe_stop(hp);
    pl_probe_stop(mp);
    pl_metrics_free(metrics);
    return rc;
}

int main(int argc, char **argv)
{
    op_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    char err[1024] = "";
    pl_kube_config kc;
    if (pl_kube_config_load_default(&kc, a.kubeconfig, err, sizeof err)) {
        pl_log(PL_LOG_ERROR, "%s", err);
        return 2;
    }
    catch_signals();
    rc = run(&a, &kc);
    pl_kube_config_free(&kc);
    return rc;
}
