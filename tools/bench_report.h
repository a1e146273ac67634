// mla-bench: result rows, the printed table, the JSON report and a small JSON
// reader for what the helper scripts write back.
#pragma once

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace bench {

constexpr double kNaN = NAN;

struct SweepPoint {
    int splits = 0;        // forced desc.num_splits
    double us = kNaN;      // median execute time
    int work_items = 0;    // schedule of that forced plan
    bool ok = true;        // correctness check of that plan
    double err = 0.0;
};

struct Row {
    // Shape.
    std::string kv_dtype;  // "bf16", "fp8", "fp8fnuz", "mxfp4"
    std::string q_dtype = "bf16";
    int batch = 0, kv_len = 0, heads = 0, q_len = 0, page_size = 0;
    bool ragged = false, shuffled = false;
    bool headline = false;     // one of the headline suite's shapes
    std::vector<int> kv_lens;  // per sequence (ragged batches differ from kv_len)
    long long total_kv = 0, total_q = 0;
    // Timing (microseconds; NaN = not measured).
    double exec_us = kNaN, exec_min_us = kNaN;
    double graph_us = kNaN, graph_meta_us = kNaN;  // replays of a captured execute / metadata + execute
    double meta_us = kNaN, dmeta_us = kNaN;        // build_metadata from host / device arrays
    int kv_copies = 1;                             // KV copies rotated between calls
    bool flushed = false;                          // cache flushed between calls instead
    // Derived.
    double bytes = 0, flops = 0, gbs = kNaN, bw_fraction = kNaN, tflops = kNaN;
    // Schedule that the automatic choice made.
    int work_items = 0, split_rows = 0, max_splits = 0, target_blocks = 0, block_tokens = 0, workers = 0;
    // Correctness against the CPU backend.
    bool check_ok = true;
    double check_err = 0.0;
    std::string check_note;
    std::vector<SweepPoint> sweep;
    // PyTorch comparison.
    double torch_us = kNaN;
    std::string note;  // anything that went wrong on the way (graph capture, ...)
};

struct RunInfo {
    std::string tool_version, git, date, backend, device, suite;
    double read_gbs = 0;        // measured streaming read bandwidth
    double read_buffer_bytes = 0;
    double cache_bytes = 0;
    double empty_kernel_us = 0; // event time of an empty one-CTA kernel (0: not measured)
    unsigned long long seed = 0;
    int iters = 0, warmup = 0;
    bool shuffle_pages = false;
    int max_batch = 0;         // --max-batch (0: each plan sized for its shape's batch)
    bool dirty_flush = false;  // --dirty-flush
    std::string torch_status;   // "" = not asked; else what happened
    std::string torch_device;
};

// Fill gbs, bw_fraction, tflops from the times and sizes.
void derive(Row &row, double read_gbs);

void print_header(std::FILE *f, const RunInfo &info);
void print_table_header(std::FILE *f);
void print_row(std::FILE *f, const Row &row);
void print_sweep(std::FILE *f, const Row &row);
void print_torch(std::FILE *f, const std::vector<Row> &rows);
// Geometric means of exec (and graph) time per KV dtype over headline rows.
std::map<std::string, std::pair<double, double>> geomeans(const std::vector<Row> &rows);
void print_geomeans(std::FILE *f, const std::vector<Row> &rows, bool gpu, const std::string &label);
// Ragged / uniform times of every ragged row whose uniform twin (same
// format, batch, mean length, heads, q_len, page) is in the run; issue 4's
// target is within 10%. Prints nothing without such pairs.
void print_ragged_ratios(std::FILE *f, const std::vector<Row> &rows, bool gpu);

bool write_json(const std::string &path, const RunInfo &info, const std::vector<Row> &rows, std::string *error);

// Minimal JSON value and parser (objects, arrays, strings, numbers, literals).
struct JValue {
    enum Type { Null, Bool, Number, String, Array, Object } type = Null;
    bool b = false;
    double num = 0;
    std::string str;
    std::vector<JValue> arr;
    std::vector<std::pair<std::string, JValue>> obj;
    const JValue *get(const std::string &key) const;  // nullptr when absent or not an object
    double number_or(double fallback) const { return type == Number ? num : fallback; }
};
bool parse_json(const std::string &text, JValue *out, std::string *error);

std::string json_escape(const std::string &s);

}  // namespace bench
