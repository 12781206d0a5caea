/* The HTML report of `pliant simulate` (sim_report.h). */
#include "sim_report.h"

#include <math.h>

#define W 760.0
#define H 220.0
#define PAD 48.0

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
static const char *const split_colors[PL_SIM_T_COUNT] = {"#2ca02c", "#ff7f0e", "#1f77b4",
                                                         "#d62728", "#7f7f7f", "#9467bd",
                                                         "#cccccc"};

double pl_sim_node_hours(const pl_sim_outcome *r) { return (double)r->acct.node_ns / 3.6e12; }

double pl_sim_samples_per_s(const pl_sim_outcome *r)
{
    return r->duration_ns > 0 ? (double)r->samples / ((double)r->duration_ns / 1e9) : 0;
}

/* A bin's value: samples/s (which 0) or mean nodes (1). */
static double bin_value(const pl_sim_outcome *r, int which, int b)
{
    const pl_sim_account *a = &r->acct;
    double secs = (double)a->bin_ns / 1e9;
    return which == 0 ? a->bin_samples[b] / secs : a->bin_node_ns[b] / (double)a->bin_ns;
}

static void axes(FILE *f, const char *title, double ymax, double hours)
{
    fprintf(f, "<svg width=\"%.0f\" height=\"%.0f\" xmlns=\"http://www.w3.org/2000/svg\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"14\" font-size=\"13\">%s</text>\n", PAD, title);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#000\"/>\n", PAD,
            H - 24, W - 10, H - 24);
    fprintf(f, "<line x1=\"%.0f\" y1=\"24\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"#000\"/>\n", PAD, PAD,
            H - 24);
    fprintf(f, "<text x=\"2\" y=\"30\">%.4g</text><text x=\"2\" y=\"%.0f\">0</text>\n", ymax, H - 24);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">0 h</text><text x=\"%.0f\" y=\"%.0f\">%.2f h</text>\n",
            PAD, H - 8, W - 60, H - 8, hours);
}

static void series(FILE *f, const pl_sim_outcome *r, int which, double ymax, const char *color, int k)
{
    const int nb = r->acct.nbins;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    for (int b = 0; b < nb; b++) {
        double x = PAD + (W - 10 - PAD) * (b + 0.5) / nb;
        double y = (H - 24) - (H - 48) * (ymax > 0 ? bin_value(r, which, b) / ymax : 0);
        fprintf(f, "%.1f,%.1f ", x, y);
    }
    fprintf(f, "\"/>\n<text x=\"%.0f\" y=\"%d\" fill=\"%s\">%s</text>\n", W - 160, 30 + 14 * k,
            color, r->strategy);
}

static void plot(FILE *f, const pl_sim_outcome *res, int n, int which, const char *title)
{
    double ymax = 0;
    for (int i = 0; i < n; i++)
        for (int b = 0; b < res[i].acct.nbins; b++)
            ymax = fmax(ymax, bin_value(&res[i], which, b));
    axes(f, title, ymax, n ? (double)res[0].duration_ns / 3.6e12 : 0);
    for (int i = 0; i < n && (which == 0 || i == 0); i++)
        series(f, &res[i], which, ymax, which ? "#555" : colors[i % 4], which ? 0 : i);
    fprintf(f, "</svg>\n");
}

static void split_bars(FILE *f, const pl_sim_outcome *res, int n)
{
    fprintf(f, "<svg width=\"%.0f\" height=\"%d\" xmlns=\"http://www.w3.org/2000/svg\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n", W, 40 + 30 * n);
    for (int k = 0; k < PL_SIM_T_COUNT; k++)
        fprintf(f, "<rect x=\"%d\" y=\"4\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"13\">%s</text>\n", 100 + 95 * k, split_colors[k],
                114 + 95 * k, pl_sim_time_kind_name(k));
    for (int i = 0; i < n; i++) {
        double x = 100, total = (double)res[i].duration_ns;
        fprintf(f, "<text x=\"4\" y=\"%d\">%s</text>\n", 44 + 30 * i, res[i].strategy);
        for (int k = 0; k < PL_SIM_T_COUNT && total > 0; k++) {
            double w = (W - 110) * (double)res[i].acct.split_ns[k] / total;
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"20\" fill=\"%s\">"
                       "<title>%s %.1f %%</title></rect>\n", x, 28 + 30 * i, w, split_colors[k],
                    pl_sim_time_kind_name(k), 100.0 * (double)res[i].acct.split_ns[k] / total);
            x += w;
        }
    }
    fprintf(f, "</svg>\n");
}

static void table(FILE *f, const pl_sim_report_info *info, const pl_sim_outcome *res, int n)
{
    fprintf(f, "<table border=\"1\" cellpadding=\"4\" cellspacing=\"0\"><tr><th>strategy</th>"
               "<th>samples/s</th><th>samples per $</th><th>node-hours</th><th>$ spent</th>"
               "<th>reconfigurations</th><th>from a checkpoint</th><th>end</th></tr>\n");
    for (int i = 0; i < n; i++) {
        const pl_sim_outcome *r = &res[i];
        double usd = pl_sim_node_hours(r) * info->spot;
        fprintf(f, "<tr><td>%s</td><td>%.1f</td><td>%.0f</td><td>%.1f</td><td>%.2f</td><td>%d</td>"
                   "<td>%d</td><td>%s</td></tr>\n", r->strategy, pl_sim_samples_per_s(r),
                usd > 0 ? (double)r->samples / usd : 0, pl_sim_node_hours(r), usd, r->reconfigs,
                r->from_checkpoint, r->end_phase);
    }
    fprintf(f, "</table>\n");
}

/* Text with &, <, >, " escaped. */
static void escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

int pl_sim_report_write(FILE *f, const pl_sim_report_info *info, const pl_sim_outcome *res, int n)
{
    fputs("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>pliant simulate</title>"
          "</head>\n<body style=\"font-family:sans-serif\">\n<h1>pliant simulate</h1>\n<p>job <b>", f);
    escaped(f, info->job);
    fputs("</b>, trace <b>", f);
    escaped(f, info->trace);
    fprintf(f, "</b> at scale %d; $%.3f spot and $%.3f on demand per node-hour</p>\n", info->scale,
            info->spot, info->on_demand);
    table(f, info, res, n);
    fprintf(f, "<h2>Throughput</h2>\n");
    plot(f, res, n, 0, "samples/s over trace time");
    fprintf(f, "<h2>Nodes</h2>\n");
    plot(f, res, n, 1, "nodes in the cluster over trace time");
    fprintf(f, "<h2>Where the time went</h2>\n");
    split_bars(f, res, n);
    fprintf(f, "</body></html>\n");
    return ferror(f) ? -1 : 0;
}
