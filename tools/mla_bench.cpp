// mla-bench: the benchmark suite of DESIGN §6 on a chosen backend.
//
// Per shape: random data, a plan, metadata built once (outside the timed
// region, and timed on its own), execute timed as the median of many calls
// with the KV rotated through enough copies (or the cache flushed) that the
// cache cannot serve it, a correctness check of a sample against a CPU
// plan, and (GPU) replays of captured graphs. Optional: forced split-count
// sweep, a same-run PyTorch comparison, JSON output and a roofline plot.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_device.h"
#include "bench_report.h"
#include "bench_version.h"
#include "mla.h"

namespace bench {
namespace {

constexpr int kDim = MLA_HEAD_DIM_QK;   // 576
constexpr int kDimV = MLA_HEAD_DIM_V;   // 512
constexpr double kPi = 3.14159265358979323846;
constexpr double kTolerance = 2e-2;     // max |out - ref| / max |ref|, and max |lse - ref|

// ---- Options ---------------------------------------------------------------

struct Options {
    std::string backend = "auto";
    int device = 0;
    std::string suite = "headline";  // headline | wide | quick
    std::vector<std::string> kv_dtypes = {"bf16", "fp8", "mxfp4"};
    std::vector<int> batches, kv_lens, heads, q_lens;  // empty = the suite's
    int page_size = 1;
    bool ragged = false;
    bool ragged_pairs = false;  // --ragged-pairs: each base shape uniform and ragged
    int iters = 0, warmup = -1;  // 0 / -1 = backend default
    bool seed_given = false;
    unsigned long long seed = 0;
    bool shuffle_pages = false;
    int max_batch = 0;  // --max-batch: plans sized for this many sequences (0: each shape's batch)
    bool sweep = false;
    bool graphs = true;
    bool dirty_flush = false;
    int threads = 0;
    std::string json, plot, python = "python3", scripts_dir;
    bool compare_torch = false;
};

void usage(std::FILE *f) {
    std::fprintf(f,
        "usage: mla-bench [options]\n"
        "\n"
        "Times MLA decode attention (libmla) on the suite of DESIGN section 6 and checks\n"
        "a sample of every result against the CPU backend.\n"
        "\n"
        "suite:\n"
        "  (default)            headline: 16 heads, q_len 1, batch {4,32,64,256} x kv_len\n"
        "                       {1024,8192}, KV bf16/fp8/mxfp4, Q bf16, page size 1\n"
        "  --suite wide         headline plus heads 32/64/128, q_len 2 and 4, page sizes\n"
        "                       1/16/64 and ragged batches (lengths uniform in 1..2*mean,\n"
        "                       same total tokens)\n"
        "  --quick              small CPU-sized suite: batch {1,4} x kv_len {256,1024}\n"
        "  --kv-dtype LIST      subset of bf16,fp8,mxfp4 (also fp8fnuz)\n"
        "  --batch LIST         override the batch sizes    (e.g. --batch 64 or 4,32)\n"
        "  --kv-len LIST        override the KV lengths\n"
        "  --heads LIST         override the head counts\n"
        "  --q-len LIST         override the query tokens per sequence\n"
        "  --page-size N        page size of the base shapes (default 1)\n"
        "  --ragged             ragged batches for the base shapes\n"
        "  --ragged-pairs       each base shape uniform and as a ragged batch of the same\n"
        "                       total tokens, then a table of ragged / uniform times\n"
        "  --shuffle-pages      random page tables instead of the identity\n"
        "  --max-batch N        size every plan for at least N sequences (an engine's one\n"
        "                       plan for all batch sizes; default: the shape's batch)\n"
        "\n"
        "running:\n"
        "  --backend B          cpu | gpu | auto (default: gpu when one is present)\n"
        "  --device N           GPU ordinal (default 0)\n"
        "  --threads N          CPU backend threads (default all)\n"
        "  --iters N            timed calls per measurement (default 100 GPU, 5 CPU)\n"
        "  --warmup N           untimed calls first (default 10 GPU, 1 CPU)\n"
        "  --seed N             data seed (default: from the clock; printed)\n"
        "  --sweep              also time forced split counts 1,2,4,..,64 per shape\n"
        "  --no-graph           skip the captured-graph timings (GPU)\n"
        "  --dirty-flush        flush the L2 by a memset (before v15) instead of by\n"
        "                       reading a buffer: the timed call then also pays for\n"
        "                       writing back the memset's dirty lines\n"
        "\n"
        "output:\n"
        "  --json FILE          write the rows, bandwidth, device, date, git as JSON\n"
        "  --compare-torch      time a plain PyTorch implementation (tools/torch_mla.py)\n"
        "                       on the same shapes and print torch_us / mla_us\n"
        "  --plot FILE.png      roofline picture (tools/plot_roofline.py, matplotlib)\n"
        "  --python PATH        interpreter for the two scripts (default python3)\n"
        "  --scripts-dir DIR    where torch_mla.py and plot_roofline.py are\n"
        "  -h, --help           this text\n"
        "\n"
        "Columns: exec_us = median execute time (metadata built beforehand); graph_us =\n"
        "one execute replayed from a captured graph; g+meta = device-array\n"
        "build_metadata + execute in one graph; meta_us = build_metadata from host\n"
        "arrays (host wall clock); dmeta_us = build_metadata from device arrays (events);\n"
        "MB = bytes moved (KV rows read + Q + out + lse); %%bw = GB/s over the streaming\n"
        "read bandwidth measured in this run; items/split = work items / largest split\n"
        "count of the automatic schedule; check = sample vs the CPU backend.\n"
        "Exit status: 0 all checks passed, 1 a check or a shape failed, 2 bad usage.\n");
}

bool parse_int(const std::string &s, long long lo, long long hi, long long *out) {
    if (s.empty()) return false;
    char *end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

std::vector<std::string> split_list(const std::string &s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty()) out.push_back(item);
    return out;
}

[[noreturn]] void bad_usage(const std::string &msg) {
    std::fprintf(stderr, "mla-bench: %s (see --help)\n", msg.c_str());
    std::exit(2);
}

std::vector<int> int_list(const std::string &opt, const std::string &v, int lo, int hi) {
    std::vector<int> out;
    for (const std::string &item : split_list(v)) {
        long long x;
        if (!parse_int(item, lo, hi, &x))
            bad_usage(opt + " " + v + ": '" + item + "' is not an integer in " + std::to_string(lo) + ".." +
                      std::to_string(hi));
        out.push_back(int(x));
    }
    if (out.empty()) bad_usage(opt + " needs a value");
    return out;
}

Options parse_options(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) bad_usage(a + " needs a value");
            return argv[++i];
        };
        long long x;
        if (a == "-h" || a == "--help") {
            usage(stdout);
            std::exit(0);
        } else if (a == "--backend") {
            o.backend = value();
            if (o.backend != "cpu" && o.backend != "gpu" && o.backend != "auto")
                bad_usage("--backend " + o.backend + ": expected cpu, gpu or auto");
        } else if (a == "--device") {
            if (!parse_int(value(), 0, 1024, &x)) bad_usage("--device needs an ordinal");
            o.device = int(x);
        } else if (a == "--suite") {
            o.suite = value();
            if (o.suite != "headline" && o.suite != "wide" && o.suite != "quick")
                bad_usage("--suite " + o.suite + ": expected headline, wide or quick");
        } else if (a == "--quick") {
            o.suite = "quick";
        } else if (a == "--kv-dtype") {
            o.kv_dtypes = split_list(value());
            for (const std::string &d : o.kv_dtypes)
                if (d != "bf16" && d != "fp8" && d != "fp8fnuz" && d != "mxfp4")
                    bad_usage("--kv-dtype: unknown dtype '" + d + "' (bf16, fp8, fp8fnuz, mxfp4)");
            if (o.kv_dtypes.empty()) bad_usage("--kv-dtype needs a value");
        } else if (a == "--batch") {
            o.batches = int_list(a, value(), 1, 65536);
        } else if (a == "--kv-len") {
            o.kv_lens = int_list(a, value(), 1, 1 << 24);
        } else if (a == "--heads") {
            o.heads = int_list(a, value(), 1, MLA_MAX_HEADS);
        } else if (a == "--q-len") {
            o.q_lens = int_list(a, value(), 1, MLA_MAX_Q_LEN);
        } else if (a == "--page-size") {
            if (!parse_int(value(), 1, MLA_MAX_PAGE_SIZE, &x) || (x & (x - 1)))
                bad_usage("--page-size needs a power of two in 1..256");
            o.page_size = int(x);
        } else if (a == "--ragged") {
            o.ragged = true;
        } else if (a == "--ragged-pairs") {
            o.ragged_pairs = true;
        } else if (a == "--shuffle-pages") {
            o.shuffle_pages = true;
        } else if (a == "--max-batch") {
            if (!parse_int(value(), 1, 1 << 20, &x)) bad_usage("--max-batch needs a positive count");
            o.max_batch = int(x);
        } else if (a == "--iters") {
            if (!parse_int(value(), 1, 1000000, &x)) bad_usage("--iters needs a positive count");
            o.iters = int(x);
        } else if (a == "--warmup") {
            if (!parse_int(value(), 0, 1000000, &x)) bad_usage("--warmup needs a count");
            o.warmup = int(x);
        } else if (a == "--seed") {
            const std::string v = value();
            char *end = nullptr;
            o.seed = std::strtoull(v.c_str(), &end, 0);
            if (v.empty() || *end) bad_usage("--seed needs an integer");
            o.seed_given = true;
        } else if (a == "--sweep") {
            o.sweep = true;
        } else if (a == "--no-graph") {
            o.graphs = false;
        } else if (a == "--dirty-flush") {
            o.dirty_flush = true;
        } else if (a == "--threads") {
            if (!parse_int(value(), 0, 1024, &x)) bad_usage("--threads needs a count in 0..1024");
            o.threads = int(x);
        } else if (a == "--json") {
            o.json = value();
        } else if (a == "--plot") {
            o.plot = value();
        } else if (a == "--python") {
            o.python = value();
        } else if (a == "--scripts-dir") {
            o.scripts_dir = value();
        } else if (a == "--compare-torch") {
            o.compare_torch = true;
        } else {
            bad_usage("unknown option " + a);
        }
    }
    if (o.ragged && o.ragged_pairs) bad_usage("--ragged and --ragged-pairs exclude each other");
    return o;
}

// ---- Errors from the library -----------------------------------------------

void mla_ok(mla_status st, const char *what) {
    if (st != MLA_SUCCESS)
        throw Error(std::string(what) + " failed: " + mla_status_string(st) + ": " + mla_last_error_message());
}

// Destroys a plan once the work queued on the device's stream is done (a GPU
// plan must not be destroyed under running work, even on an error path).
struct PlanDeleter {
    Device *dev = nullptr;
    void operator()(mla_plan *p) const {
        if (dev) {
            try {
                dev->synchronize();
            } catch (const Error &) {
            }
        }
        mla_plan_destroy(p);
    }
};
using PlanPtr = std::unique_ptr<mla_plan, PlanDeleter>;

// ---- Formats and random data ----------------------------------------------

struct DtypeInfo {
    const char *name;
    mla_dtype dtype;
    int row_bytes;    // bytes of one KV row in the kv array
    int scale_bytes;  // E8M0 bytes per row in the separate array (mxfp4)
};

DtypeInfo dtype_info(const std::string &name) {
    if (name == "bf16") return {"bf16", MLA_DTYPE_BF16, 2 * kDim, 0};
    if (name == "fp8") return {"fp8", MLA_DTYPE_FP8_E4M3, kDim, 0};
    if (name == "fp8fnuz") return {"fp8fnuz", MLA_DTYPE_FP8_E4M3_FNUZ, kDim, 0};
    return {"mxfp4", MLA_DTYPE_MXFP4, kDim / 2, MLA_MXFP4_SCALES_PER_ROW};
}

uint64_t splitmix(uint64_t &s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed) {}
    uint64_t next() { return splitmix(s); }
    double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
    int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }  // [lo, hi]
};

float bf16_to_float(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t float_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return uint16_t(bits >> 16);
}

// Decoded value of an FP8 byte (OCP e4m3fn, or the FNUZ variant); NaN encodings give NaN.
double fp8_value(uint8_t v, bool fnuz) {
    const int sign = (v & 0x80) ? -1 : 1, e = (v >> 3) & 0xf, m = v & 7;
    if (fnuz) {
        if (v == 0x80) return NAN;
        return sign * (e == 0 ? std::ldexp(m / 8.0, -7) : std::ldexp(1.0 + m / 8.0, e - 8));
    }
    if (e == 15 && m == 7) return NAN;
    return sign * (e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7));
}

bool fp8_is_nan(uint8_t v, bool fnuz) { return fnuz ? v == 0x80 : (v & 0x7f) == 0x7f; }

constexpr int kScaleLo = 120, kScaleHi = 130;  // E8M0 exponents of the mxfp4 data

// RMS of the dequantised KV values that the generator produces, before kv_scale.
double raw_kv_rms(mla_dtype d) {
    if (d == MLA_DTYPE_BF16) return 1.0;
    if (d == MLA_DTYPE_MXFP4) {
        const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
        double e2 = 0, s2 = 0;
        for (double m : mags) e2 += m * m / 8;
        for (int e = kScaleLo; e <= kScaleHi; ++e) s2 += std::ldexp(1.0, 2 * (e - 127)) / (kScaleHi - kScaleLo + 1);
        return std::sqrt(e2 * s2);
    }
    const bool fnuz = d == MLA_DTYPE_FP8_E4M3_FNUZ;
    double sum = 0;
    int n = 0;
    for (int v = 0; v < 256; ++v)
        if (!fp8_is_nan(uint8_t(v), fnuz)) {
            const double x = fp8_value(uint8_t(v), fnuz);
            sum += x * x;
            ++n;
        }
    return std::sqrt(sum / n);
}

// Run f(begin, end, chunk_index) over [0, n) in chunks on all cores.
template <typename F>
void parallel_chunks(size_t n, size_t chunk, F f) {
    const size_t chunks = (n + chunk - 1) / chunk;
    const size_t threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), chunks);
    if (threads <= 1) {
        for (size_t c = 0; c < chunks; ++c) f(c * chunk, std::min(n, (c + 1) * chunk), c);
        return;
    }
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            for (size_t c = t; c < chunks; c += threads) f(c * chunk, std::min(n, (c + 1) * chunk), c);
        });
    for (std::thread &th : pool) th.join();
}

// 65536 normal samples (Box-Muller) times `scale`, as bf16: indexed by 16 random bits.
std::vector<uint16_t> normal_table(uint64_t seed, double scale) {
    std::vector<uint16_t> t(65536);
    Rng rng(seed);
    for (size_t i = 0; i < t.size(); i += 2) {
        const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
        const double r = std::sqrt(-2.0 * std::log(u1)) * scale;
        t[i] = float_to_bf16(float(r * std::cos(2 * kPi * u2)));
        t[i + 1] = float_to_bf16(float(r * std::sin(2 * kPi * u2)));
    }
    return t;
}

void fill_bf16_normal(uint16_t *dst, size_t n, uint64_t seed, double scale) {
    const std::vector<uint16_t> table = normal_table(seed, scale);
    parallel_chunks(n, size_t(1) << 20, [&](size_t b, size_t e, size_t c) {
        uint64_t s = seed ^ (0xa5a5a5a5ull + c * 0x100000001b3ull);
        size_t i = b;
        for (; i + 4 <= e; i += 4) {
            const uint64_t r = splitmix(s);
            dst[i] = table[r & 0xffff];
            dst[i + 1] = table[(r >> 16) & 0xffff];
            dst[i + 2] = table[(r >> 32) & 0xffff];
            dst[i + 3] = table[r >> 48];
        }
        for (; i < e; ++i) dst[i] = table[splitmix(s) & 0xffff];
    });
}

// Random bytes; `fix` (if set) remaps each byte (used to avoid NaN encodings).
template <typename Fix>
void fill_bytes(uint8_t *dst, size_t n, uint64_t seed, Fix fix) {
    parallel_chunks(n, size_t(1) << 22, [&](size_t b, size_t e, size_t c) {
        uint64_t s = seed ^ (0x5bd1e995ull + c * 0x9e3779b97f4a7c15ull);
        for (size_t i = b; i < e; i += 8) {
            uint64_t r = splitmix(s);
            for (size_t k = i; k < std::min(e, i + 8); ++k, r >>= 8) dst[k] = fix(uint8_t(r));
        }
    });
}

// Host copy of a random KV pool, kept across the shapes of one dtype.
struct HostKv {
    std::string dtype;
    size_t rows = 0;
    std::vector<uint8_t> data, scales;

    // At least need_rows rows of dtype d; when it must (re)generate, it makes
    // reserve_rows so that the larger shapes that follow reuse the same pool.
    void ensure(const DtypeInfo &d, size_t need_rows, size_t reserve_rows, uint64_t seed) {
        if (dtype == d.name && rows >= need_rows) return;
        dtype = d.name;
        rows = std::max(need_rows, reserve_rows);
        data.assign(0, 0);
        data.shrink_to_fit();
        data.resize(rows * size_t(d.row_bytes));
        scales.clear();
        const uint64_t s = seed * 0x2545f4914f6cdd1dull + uint64_t(d.dtype);
        if (d.dtype == MLA_DTYPE_BF16) {
            fill_bf16_normal(reinterpret_cast<uint16_t *>(data.data()), rows * kDim, s, 1.0);
        } else if (d.dtype == MLA_DTYPE_MXFP4) {
            fill_bytes(data.data(), data.size(), s, [](uint8_t b) { return b; });
            scales.resize(rows * size_t(d.scale_bytes));
            fill_bytes(scales.data(), scales.size(), s + 1,
                       [](uint8_t b) { return uint8_t(kScaleLo + b % (kScaleHi - kScaleLo + 1)); });
        } else {
            const bool fnuz = d.dtype == MLA_DTYPE_FP8_E4M3_FNUZ;
            fill_bytes(data.data(), data.size(), s,
                       [fnuz](uint8_t b) { return fp8_is_nan(b, fnuz) ? uint8_t(b ^ 1u) : b; });
        }
    }
};

// ---- Shapes ----------------------------------------------------------------

struct Case {
    DtypeInfo kv;
    int batch, kv_len, heads, q_len, page;
    bool ragged;
    bool base;  // part of the suite's base grid (geometric mean)

    // Upper bound of the KV pool rows of this shape (ragged pages included).
    size_t max_pool_rows() const {
        const size_t per_seq = size_t(ragged ? 2 * kv_len : kv_len) + size_t(page);
        return std::min(size_t(batch) * per_seq, size_t(batch) * size_t(kv_len) + size_t(batch) * size_t(page));
    }
};

std::vector<Case> build_cases(const Options &o) {
    const bool quick = o.suite == "quick";
    const std::vector<int> batches = !o.batches.empty() ? o.batches : quick ? std::vector<int>{1, 4}
                                                                            : std::vector<int>{4, 32, 64, 256};
    const std::vector<int> kv_lens = !o.kv_lens.empty() ? o.kv_lens : quick ? std::vector<int>{256, 1024}
                                                                            : std::vector<int>{1024, 8192};
    const std::vector<int> heads = !o.heads.empty() ? o.heads : std::vector<int>{16};
    const std::vector<int> q_lens = !o.q_lens.empty() ? o.q_lens : std::vector<int>{1};

    // (heads, q_len, page, ragged, base) variants, each over batch x kv_len.
    std::vector<std::tuple<int, int, int, bool, bool>> variants;
    for (int h : heads)
        for (int q : q_lens) {
            variants.emplace_back(h, q, o.page_size, o.ragged, true);
            if (o.ragged_pairs) variants.emplace_back(h, q, o.page_size, true, false);
        }
    if (o.suite == "wide") {
        for (int h : {32, 64, 128}) variants.emplace_back(h, 1, o.page_size, o.ragged, false);
        for (int q : {2, 4}) variants.emplace_back(16, q, o.page_size, o.ragged, false);
        for (int p : {1, 16, 64}) variants.emplace_back(16, 1, p, o.ragged, false);
        variants.emplace_back(16, 1, o.page_size, true, false);
    }
    std::vector<Case> cases;
    std::set<std::tuple<std::string, int, int, int, int, int, bool>> seen;
    for (const std::string &dt : o.kv_dtypes) {
        const DtypeInfo d = dtype_info(dt);
        for (const auto &v : variants) {
            const int h = std::get<0>(v), q = std::get<1>(v), p = std::get<2>(v);
            const bool rag = std::get<3>(v), base = std::get<4>(v);
            for (int b : batches)
                for (int l : kv_lens) {
                    if (rag && !base && b == 1) continue;  // a ragged twin of one sequence is the uniform shape
                    if (!seen.insert({dt, b, l, h, q, p, rag}).second) continue;
                    cases.push_back({d, b, l, h, q, p, rag, base});
                }
        }
    }
    return cases;
}

// Lengths of a batch: all `mean`, or uniform in 1..2*mean with the same total.
std::vector<int> batch_lengths(const Case &c, Rng &rng) {
    std::vector<int> len(size_t(c.batch), c.kv_len);
    if (!c.ragged || c.batch == 1) return len;
    const int hi = 2 * c.kv_len;
    long long sum = 0;
    for (int &l : len) {
        l = int(rng.range(1, hi));
        sum += l;
    }
    long long diff = (long long)c.batch * c.kv_len - sum;
    while (diff != 0) {
        int &l = len[size_t(rng.range(0, c.batch - 1))];
        if (diff > 0 && l < hi) { ++l; --diff; }
        else if (diff < 0 && l > 1) { --l; ++diff; }
    }
    return len;
}

// ---- One shape ---------------------------------------------------------------

struct Layout {
    std::vector<int> kv_len;
    std::vector<int32_t> qo_indptr, kv_indptr, last_page_len, page_table;  // page_table empty = identity
    int64_t pages = 0;
    long long total_kv = 0;
    int total_q = 0;

    int64_t page_of(int64_t slot) const { return page_table.empty() ? slot : page_table[size_t(slot)]; }
};

Layout make_layout(const Case &c, const std::vector<int> &lens, bool shuffle, Rng &rng) {
    Layout L;
    L.kv_len = lens;
    L.qo_indptr.push_back(0);
    L.kv_indptr.push_back(0);
    for (int b = 0; b < c.batch; ++b) {
        const int len = lens[size_t(b)];
        const int pages = (len + c.page - 1) / c.page;
        L.qo_indptr.push_back(L.qo_indptr.back() + c.q_len);
        L.kv_indptr.push_back(L.kv_indptr.back() + pages);
        L.last_page_len.push_back(pages ? len - (pages - 1) * c.page : 1);
        L.total_kv += len;
    }
    L.pages = L.kv_indptr.back();
    L.total_q = L.qo_indptr.back();
    if (shuffle) {
        L.page_table.resize(size_t(L.pages));
        std::iota(L.page_table.begin(), L.page_table.end(), 0);
        for (size_t i = L.page_table.size(); i > 1; --i) std::swap(L.page_table[i - 1], L.page_table[size_t(rng.range(0, int64_t(i) - 1))]);
    }
    return L;
}

// The CPU backend's output for a sample of the sequences, to compare with.
struct Reference {
    std::vector<int> seqs;
    std::vector<std::vector<float>> out, lse;  // per sampled sequence: [q_len*heads*512], [q_len*heads]
};

mla_plan_desc base_desc(const Case &c, mla_backend backend, int max_batch, const Options &o) {
    mla_plan_desc d;
    mla_plan_desc_init(&d);
    d.num_heads = c.heads;
    d.q_dtype = MLA_DTYPE_BF16;
    d.kv_dtype = c.kv.dtype;
    d.page_size = c.page;
    d.max_batch_size = std::max(1, max_batch);
    d.max_q_len = c.q_len;
    d.backend = backend;
    d.device = o.device;
    d.num_threads = o.threads;
    return d;
}

Reference cpu_reference(const Case &c, const Layout &L, const HostKv &kv, const std::vector<uint16_t> &q,
                        float kv_scale, const Options &o) {
    Reference ref;
    std::set<int> pick = {0, c.batch / 2, c.batch - 1};
    pick.insert(int(std::max_element(L.kv_len.begin(), L.kv_len.end()) - L.kv_len.begin()));
    ref.seqs.assign(pick.begin(), pick.end());
    const int n = int(ref.seqs.size());

    std::vector<int32_t> qo{0}, kvp{0}, last, table;
    std::vector<uint16_t> subq;
    const size_t qrow = size_t(c.heads) * kDim;
    for (int b : ref.seqs) {
        qo.push_back(qo.back() + c.q_len);
        const int pages = L.kv_indptr[size_t(b) + 1] - L.kv_indptr[size_t(b)];
        kvp.push_back(kvp.back() + pages);
        last.push_back(L.last_page_len[size_t(b)]);
        for (int p = 0; p < pages; ++p) table.push_back(int32_t(L.page_of(L.kv_indptr[size_t(b)] + p)));
        const size_t t0 = size_t(L.qo_indptr[size_t(b)]);
        subq.insert(subq.end(), q.begin() + long(t0 * qrow), q.begin() + long((t0 + size_t(c.q_len)) * qrow));
    }
    if (table.empty()) table.push_back(0);

    mla_plan_desc d = base_desc(c, MLA_BACKEND_CPU, n, o);
    mla_plan *raw = nullptr;
    mla_ok(mla_plan_create(&d, &raw), "mla_plan_create (CPU reference)");
    PlanPtr plan(raw);
    mla_batch batch;
    mla_batch_init(&batch);
    batch.batch_size = n;
    batch.qo_indptr = qo.data();
    batch.kv_indptr = kvp.data();
    batch.kv_last_page_len = last.data();
    mla_ok(mla_plan_build_metadata(plan.get(), &batch, nullptr), "mla_plan_build_metadata (CPU reference)");

    const size_t rows = size_t(qo.back()) * size_t(c.heads);
    std::vector<uint16_t> out(rows * kDimV);
    std::vector<float> lse(rows);
    mla_tensors t;
    mla_tensors_init(&t);
    t.q = subq.data();
    t.kv = kv.data.data();
    t.kv_block_scales = kv.scales.empty() ? nullptr : kv.scales.data();
    t.kv_indices = table.data();
    t.out = out.data();
    t.lse = lse.data();
    t.kv_scale = kv_scale;
    t.num_pages = L.pages;
    mla_ok(mla_plan_execute(plan.get(), &t, nullptr), "mla_plan_execute (CPU reference)");

    const size_t per_seq = size_t(c.q_len) * size_t(c.heads);
    for (int i = 0; i < n; ++i) {
        std::vector<float> o_f(per_seq * kDimV);
        for (size_t k = 0; k < o_f.size(); ++k) o_f[k] = bf16_to_float(out[size_t(i) * per_seq * kDimV + k]);
        ref.out.push_back(std::move(o_f));
        ref.lse.emplace_back(lse.begin() + long(size_t(i) * per_seq), lse.begin() + long(size_t(i + 1) * per_seq));
    }
    return ref;
}

// Largest error of the sampled rows of a device output: max |out - ref| over
// max |ref|, or |lse - ref|, whichever is larger; infinity for NaN or a
// finite/-inf mismatch.
double compare(Device &dev, const Case &c, const Layout &L, const Reference &ref, const Buffer &out, const Buffer &lse) {
    const size_t per_seq = size_t(c.q_len) * size_t(c.heads);
    double max_ref = 1e-6, max_diff = 0, lse_err = 0;
    std::vector<uint16_t> o(per_seq * kDimV);
    std::vector<float> l(per_seq);
    for (size_t i = 0; i < ref.seqs.size(); ++i) {
        const size_t t0 = size_t(L.qo_indptr[size_t(ref.seqs[i])]);
        dev.download(o.data(), out.as<uint8_t>() + t0 * size_t(c.heads) * kDimV * 2, o.size() * 2);
        dev.download(l.data(), lse.as<uint8_t>() + t0 * size_t(c.heads) * 4, l.size() * 4);
        for (size_t k = 0; k < o.size(); ++k) {
            const double got = bf16_to_float(o[k]), want = ref.out[i][k];
            if (!std::isfinite(got)) return INFINITY;
            max_ref = std::max(max_ref, std::fabs(want));
            max_diff = std::max(max_diff, std::fabs(got - want));
        }
        for (size_t k = 0; k < l.size(); ++k) {
            const double got = l[k], want = ref.lse[i][k];
            if (std::isnan(got)) return INFINITY;
            if (std::isinf(want) || std::isinf(got)) {
                if (got != want) return INFINITY;
                continue;
            }
            lse_err = std::max(lse_err, std::fabs(got - want));
        }
    }
    return std::max(max_diff / max_ref, lse_err);
}

class ShapeRun {
public:
    ShapeRun(Device &dev, const Options &o, const Case &c, HostKv &kv, size_t reserve_rows, uint64_t seed, int iters,
             int warmup)
        : dev_(dev), o_(o), c_(c), kv_(kv), reserve_rows_(reserve_rows), iters_(iters), warmup_(warmup), rng_(seed) {}

    Row run() {
        setup();
        Row r = describe();
        mla_plan_desc d = base_desc(c_, dev_.is_gpu() ? MLA_BACKEND_GPU : MLA_BACKEND_CPU, plan_batch(), o_);
        PlanPtr plan = make_plan(d);
        build_host_metadata(plan.get());
        schedule_info(plan.get(), &r);

        check(plan.get(), &r.check_ok, &r.check_err);
        const std::vector<double> us = time_execute(plan.get());
        r.exec_us = median(us);
        r.exec_min_us = *std::min_element(us.begin(), us.end());
        r.meta_us = time_host_metadata(plan.get());

        if (dev_.is_gpu()) {
            r.dmeta_us = median(dev_.time_each(warmup_, iters_, false, [&](int) { build_device_metadata(plan.get(), dev_.stream()); }));
            if (o_.graphs && dev_.supports_graphs()) time_graphs(plan.get(), &r);
        }
        if (o_.sweep) sweep(&r);
        dev_.synchronize();
        return r;
    }

private:
    void setup() {
        const std::vector<int> lens = batch_lengths(c_, rng_);
        L_ = make_layout(c_, lens, o_.shuffle_pages, rng_);
        const size_t pool_rows = size_t(L_.pages) * size_t(c_.page);
        kv_.ensure(c_.kv, std::max<size_t>(pool_rows, 1), reserve_rows_, o_.seed);
        kv_scale_ = c_.kv.dtype == MLA_DTYPE_FP8_E4M3 || c_.kv.dtype == MLA_DTYPE_FP8_E4M3_FNUZ
                        ? float(1.0 / raw_kv_rms(c_.kv.dtype)) : 0.0f;
        const double k_rms = kv_scale_ > 0 ? 1.0 : raw_kv_rms(c_.kv.dtype);
        // Scores sm_scale * q.k then have a standard deviation of about 2:
        // peaked enough that the softmax is not flat, far from one-hot.
        q_.resize(size_t(L_.total_q) * size_t(c_.heads) * kDim);
        fill_bf16_normal(q_.data(), q_.size(), rng_.next(), 2.0 / k_rms);

        // KV copies: rotate so that the copies together are >= 3x the cache,
        // or flush the cache between calls when one copy already is.
        const size_t data_bytes = pool_rows * size_t(c_.kv.row_bytes);
        const size_t scale_bytes = pool_rows * size_t(c_.kv.scale_bytes);
        const size_t copy_bytes = std::max<size_t>(data_bytes + scale_bytes, 1);
        const size_t need = 3 * dev_.cache_bytes();
        copies_ = 1;
        flush_ = true;
        if (copy_bytes < need) {
            copies_ = int((need + copy_bytes - 1) / copy_bytes);
            copies_ = std::min<int>(copies_, 256);
            const size_t fit = dev_.rotation_budget_bytes() / copy_bytes;
            flush_ = size_t(copies_) > fit || size_t(copies_) * copy_bytes < need;
            copies_ = int(std::max<size_t>(1, std::min<size_t>(size_t(copies_), fit)));
        }
        for (int k = 0; k < copies_; ++k) {
            kv_dev_.emplace_back(dev_, std::max<size_t>(data_bytes, 16));
            if (k == 0) dev_.upload(kv_dev_[0].get(), kv_.data.data(), data_bytes);
            else dev_.copy(kv_dev_[size_t(k)].get(), kv_dev_[0].get(), data_bytes);
            if (scale_bytes) {
                scales_dev_.emplace_back(dev_, scale_bytes);
                if (k == 0) dev_.upload(scales_dev_[0].get(), kv_.scales.data(), scale_bytes);
                else dev_.copy(scales_dev_[size_t(k)].get(), scales_dev_[0].get(), scale_bytes);
            }
        }
        q_dev_ = upload(q_.data(), q_.size() * 2);
        const size_t rows = size_t(L_.total_q) * size_t(c_.heads);
        out_dev_ = Buffer(dev_, rows * kDimV * 2);
        lse_dev_ = Buffer(dev_, rows * 4);
        if (!L_.page_table.empty()) table_dev_ = upload(L_.page_table.data(), L_.page_table.size() * 4);
        qo_dev_ = upload(L_.qo_indptr.data(), L_.qo_indptr.size() * 4);
        kvp_dev_ = upload(L_.kv_indptr.data(), L_.kv_indptr.size() * 4);
        last_dev_ = upload(L_.last_page_len.data(), std::max<size_t>(L_.last_page_len.size(), 1) * 4);

        ref_ = cpu_reference(c_, L_, kv_, q_, kv_scale_, o_);
    }

    Buffer upload(const void *src, size_t bytes) {
        Buffer b(dev_, bytes);
        dev_.upload(b.get(), src, bytes);
        return b;
    }

    Row describe() const {
        Row r;
        r.kv_dtype = c_.kv.name;
        r.batch = c_.batch;
        r.kv_len = c_.kv_len;
        r.heads = c_.heads;
        r.q_len = c_.q_len;
        r.page_size = c_.page;
        r.ragged = c_.ragged;
        r.shuffled = o_.shuffle_pages;
        r.headline = c_.base;
        r.kv_lens = L_.kv_len;
        r.total_kv = L_.total_kv;
        r.total_q = L_.total_q;
        r.kv_copies = copies_;
        r.flushed = flush_;
        const double rows = double(L_.total_q) * c_.heads;
        r.bytes = double(L_.total_kv) * (c_.kv.row_bytes + c_.kv.scale_bytes) + rows * (2.0 * kDim + 2.0 * kDimV + 4.0);
        double fl = 0;
        for (int b = 0; b < c_.batch; ++b) fl += double(c_.q_len) * c_.heads * L_.kv_len[size_t(b)];
        r.flops = 2.0 * fl * (kDim + kDimV);
        return r;
    }

    PlanPtr make_plan(const mla_plan_desc &d) {
        mla_plan *raw = nullptr;
        mla_ok(mla_plan_create(&d, &raw), "mla_plan_create");
        return PlanPtr(raw, PlanDeleter{&dev_});
    }

    void build_host_metadata(mla_plan *plan) {
        mla_batch b;
        mla_batch_init(&b);
        b.batch_size = c_.batch;
        b.qo_indptr = L_.qo_indptr.data();
        b.kv_indptr = L_.kv_indptr.data();
        b.kv_last_page_len = L_.last_page_len.data();
        mla_ok(mla_plan_build_metadata(plan, &b, dev_.stream()), "mla_plan_build_metadata");
    }

    void build_device_metadata(mla_plan *plan, void *stream) {
        mla_batch b;
        mla_batch_init(&b);
        b.batch_size = c_.batch;
        b.qo_indptr = qo_dev_.as<const int32_t>();
        b.kv_indptr = kvp_dev_.as<const int32_t>();
        b.kv_last_page_len = last_dev_.as<const int32_t>();
        b.memory = MLA_MEMORY_DEVICE;
        mla_ok(mla_plan_build_metadata(plan, &b, stream), "mla_plan_build_metadata (device arrays)");
    }

    static void schedule_info(mla_plan *plan, Row *r) {
        mla_schedule_info info;
        mla_schedule_info_init(&info);
        if (mla_plan_schedule_info(plan, &info) != MLA_SUCCESS) return;
        r->work_items = info.num_work_items;
        r->split_rows = info.num_split_rows;
        r->max_splits = info.max_splits;
        r->target_blocks = info.target_blocks;
        r->block_tokens = info.block_tokens;
        r->workers = info.workers;
    }

    mla_tensors tensors(int copy) const {
        const size_t k = size_t(copy % copies_);
        mla_tensors t;
        mla_tensors_init(&t);
        t.q = q_dev_.get();
        t.kv = kv_dev_[k].get();
        t.kv_block_scales = scales_dev_.empty() ? nullptr : scales_dev_[k].as<const uint8_t>();
        t.kv_indices = table_dev_.get() ? table_dev_.as<const int32_t>() : nullptr;
        t.out = out_dev_.get();
        t.lse = lse_dev_.as<float>();
        t.kv_scale = kv_scale_;
        t.num_pages = L_.pages;
        return t;
    }

    void execute(mla_plan *plan, int copy, void *stream) {
        const mla_tensors t = tensors(copy);
        mla_ok(mla_plan_execute(plan, &t, stream), "mla_plan_execute");
    }

    // One execute on poisoned outputs, compared with the CPU reference.
    void check(mla_plan *plan, bool *ok, double *err) {
        poison_outputs();
        execute(plan, 0, dev_.stream());
        dev_.synchronize();
        verify(ok, err);
    }

    void poison_outputs() {
        dev_.fill(out_dev_.get(), 0xff, out_dev_.size());  // bf16 NaN
        dev_.fill(lse_dev_.get(), 0xff, lse_dev_.size());  // float NaN
    }

    void verify(bool *ok, double *err) {
        const double e = compare(dev_, c_, L_, ref_, out_dev_, lse_dev_);
        *err = std::max(*err, e);
        if (!(e <= kTolerance)) *ok = false;
    }

    std::vector<double> time_execute(mla_plan *plan) {
        return dev_.time_each(warmup_, iters_, flush_, [&](int i) { execute(plan, i, dev_.stream()); });
    }

    // build_metadata from host arrays: host wall clock of the call, stream idle before.
    double time_host_metadata(mla_plan *plan) {
        std::vector<double> us;
        for (int i = 0; i < warmup_ + iters_; ++i) {
            dev_.synchronize();
            const auto t0 = std::chrono::steady_clock::now();
            build_host_metadata(plan);
            const double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            if (i >= warmup_) us.push_back(t);
        }
        return median(us);
    }

    void time_graphs(mla_plan *plan, Row *r) {
        try {
            r->graph_us = dev_.time_graphs(copies_, warmup_, iters_, flush_,
                                           [&](int k, void *s) { execute(plan, k, s); });
            poison_outputs();
            r->graph_meta_us = dev_.time_graphs(copies_, warmup_, iters_, flush_, [&](int k, void *s) {
                build_device_metadata(plan, s);
                execute(plan, k, s);
            });
            dev_.synchronize();
            verify(&r->check_ok, &r->check_err);  // the device-metadata path's output
            if (!r->check_ok) r->note = "device-metadata graph output differs";
        } catch (const Error &e) {
            r->note = std::string("graph: ") + e.what();
        }
        build_host_metadata(plan);
    }

    void sweep(Row *r) {
        const int block = r->block_tokens > 0 ? r->block_tokens : 64;
        const int max_len = *std::max_element(L_.kv_len.begin(), L_.kv_len.end());
        const int max_useful = std::max(1, (max_len + block - 1) / block);
        for (int s = 1; s <= MLA_MAX_SPLITS; s *= 2) {
            if (s > max_useful) break;
            SweepPoint p;
            p.splits = s;
            try {
                mla_plan_desc d = base_desc(c_, dev_.is_gpu() ? MLA_BACKEND_GPU : MLA_BACKEND_CPU, plan_batch(), o_);
                d.num_splits = s;
                PlanPtr plan = make_plan(d);
                build_host_metadata(plan.get());
                Row info;
                schedule_info(plan.get(), &info);
                p.work_items = info.work_items;
                check(plan.get(), &p.ok, &p.err);
                p.us = median(time_execute(plan.get()));
                dev_.synchronize();
            } catch (const Error &e) {
                p.ok = false;
                p.err = INFINITY;
                std::fprintf(stderr, "  sweep %d splits: %s\n", s, e.what());
            }
            if (!p.ok) {
                r->check_ok = false;
                r->check_err = std::max(r->check_err, p.err);
            }
            r->sweep.push_back(p);
        }
    }

    // Sequences the timed plans are sized for (--max-batch: an engine's one plan).
    int plan_batch() const { return std::max(c_.batch, o_.max_batch); }

    Device &dev_;
    const Options &o_;
    Case c_;
    HostKv &kv_;
    size_t reserve_rows_;
    int iters_, warmup_;
    Rng rng_;
    Layout L_;
    std::vector<uint16_t> q_;
    float kv_scale_ = 0.0f;
    int copies_ = 1;
    bool flush_ = false;
    std::vector<Buffer> kv_dev_, scales_dev_;
    Buffer q_dev_, out_dev_, lse_dev_, table_dev_, qo_dev_, kvp_dev_, last_dev_;
    Reference ref_;
};

// ---- Helper scripts ------------------------------------------------------------

bool file_exists(const std::string &p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
}

std::string scripts_dir(const Options &o) {
    if (!o.scripts_dir.empty()) return o.scripts_dir;
    if (const char *env = std::getenv("MLA_BENCH_SCRIPTS_DIR")) return env;
    if (file_exists(std::string(MLA_BENCH_SOURCE_DIR) + "/torch_mla.py")) return MLA_BENCH_SOURCE_DIR;
    return MLA_BENCH_DATA_DIR;
}

std::string shell_quote(const std::string &s) {
    std::string q = "'";
    for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
}

// Run a command line; its exit status (-1 when it could not run or died).
int run_command(const std::string &cmd) {
    std::fflush(stdout);
    std::fflush(stderr);
    const int st = std::system(cmd.c_str());
    if (st == -1 || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

bool read_file(const std::string &path, std::string *out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::ostringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    return true;
}

struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/mla-bench.XXXXXX";
        if (::mkdtemp(tmpl)) path = tmpl;
    }
    ~TempDir() {
        if (!path.empty()) run_command("rm -rf " + shell_quote(path));
    }
};

void compare_torch(const Options &o, bool gpu, int iters, int warmup, unsigned long long seed, std::vector<Row> &rows,
                   RunInfo &info, const TempDir &tmp) {
    const std::string script = scripts_dir(o) + "/torch_mla.py";
    std::printf("\nPyTorch comparison: %s\n", script.c_str());
    if (tmp.path.empty() || !file_exists(script)) {
        info.torch_status = "script not found: " + script;
        std::printf("  skipped: %s\n", info.torch_status.c_str());
        return;
    }
    const std::string in = tmp.path + "/torch_shapes.json", out = tmp.path + "/torch_results.json";
    {
        std::ofstream f(in);
        f << "{\"iters\": " << iters << ", \"warmup\": " << warmup << ", \"seed\": " << seed
          << ", \"shuffle_pages\": " << (o.shuffle_pages ? "true" : "false")
          << ", \"dirty_flush\": " << (o.dirty_flush ? "true" : "false") << ", \"shapes\": [";
        for (size_t i = 0; i < rows.size(); ++i) {
            const Row &r = rows[i];
            f << (i ? ",\n" : "\n") << "{\"id\": " << i << ", \"kv_dtype\": \"" << r.kv_dtype << "\", \"batch\": " << r.batch
              << ", \"heads\": " << r.heads << ", \"q_len\": " << r.q_len << ", \"page_size\": " << r.page_size
              << ", \"kv_lens\": [";
            for (size_t b = 0; b < r.kv_lens.size(); ++b) f << (b ? "," : "") << r.kv_lens[b];
            f << "]}";
        }
        f << "]}\n";
    }
    const std::string cmd = shell_quote(o.python) + " " + shell_quote(script) + " --shapes " + shell_quote(in) +
                            " --out " + shell_quote(out) + " --device " + (gpu ? "cuda" : "cpu");
    const int st = run_command(cmd);
    std::string text, err;
    JValue doc;
    if (!read_file(out, &text) || !parse_json(text, &doc, &err)) {
        info.torch_status = st == -1 ? "could not run " + o.python : "no results (exit status " + std::to_string(st) + ")";
        std::printf("  skipped: %s\n", info.torch_status.c_str());
        return;
    }
    const JValue *avail = doc.get("available");
    if (avail && avail->type == JValue::Bool && !avail->b) {
        const JValue *why = doc.get("reason");
        info.torch_status = "unavailable: " + (why ? why->str : std::string("?"));
        std::printf("  skipped: %s\n", info.torch_status.c_str());
        return;
    }
    if (const JValue *dev = doc.get("device")) info.torch_device = dev->str;
    info.torch_status = "ok";
    if (const JValue *res = doc.get("results"))
        for (const JValue &item : res->arr) {
            const JValue *id = item.get("id"), *us = item.get("us");
            if (!id || !us) continue;
            const size_t k = size_t(id->number_or(-1));
            if (k < rows.size()) rows[k].torch_us = us->number_or(kNaN);
        }
    print_torch(stdout, rows);
}

void plot(const Options &o, const std::string &json) {
    const std::string script = scripts_dir(o) + "/plot_roofline.py";
    if (!file_exists(script)) {
        std::printf("plot skipped: %s not found\n", script.c_str());
        return;
    }
    const int st = run_command(shell_quote(o.python) + " " + shell_quote(script) + " " + shell_quote(json) + " " +
                               shell_quote(o.plot));
    if (st == 0) std::printf("wrote %s\n", o.plot.c_str());
    else if (st == 3) std::printf("plot skipped (see the message above)\n");
    else std::printf("plot failed (%s exit status %d)\n", o.python.c_str(), st);
}

std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string short_dims(const Case &c) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s batch %d kv_len %s%d heads %d q_len %d page %d", c.kv.name, c.batch,
                  c.ragged ? "~" : "", c.kv_len, c.heads, c.q_len, c.page);
    return buf;
}

int run(int argc, char **argv) {
    Options o = parse_options(argc, argv);
    if (!o.seed_given)
        o.seed = (unsigned long long)std::chrono::system_clock::now().time_since_epoch().count() ^
                 (unsigned long long)::getpid() << 32;

    // Device: the GPU for gpu/auto when the library sees one, else the host.
    std::unique_ptr<Device> dev;
    std::string why;
    if (o.backend != "cpu") {
        const int count = mla_gpu_device_count();
        if (count > o.device) dev = make_gpu_device(o.device, &why);
        else why = count > 0 ? "GPU " + std::to_string(o.device) + " not present" : "libmla sees no GPU (mla_gpu_device_count() = 0)";
        if (!dev && o.backend == "gpu") {
            std::fprintf(stderr, "mla-bench: --backend gpu: %s\n", why.c_str());
            return 2;
        }
    }
    if (!dev) dev = make_host_device();
    const bool gpu = dev->is_gpu();
    dev->set_dirty_flush(o.dirty_flush);
    const int iters = o.iters > 0 ? o.iters : gpu ? 100 : 5;
    const int warmup = o.warmup >= 0 ? o.warmup : gpu ? 10 : 1;

    RunInfo info;
    const int lib = mla_version();
    info.tool_version = std::to_string(lib / 10000) + "." + std::to_string(lib / 100 % 100) + "." +
                        std::to_string(lib % 100);
    if (lib != MLA_VERSION) info.tool_version += " (built against " + std::to_string(MLA_VERSION) + ")";
    info.git = MLA_BENCH_GIT_DESCRIBE;
    info.date = utc_now();
    info.backend = gpu ? "gpu" : "cpu";
    info.device = dev->name();
    info.suite = o.suite + (o.ragged ? ", ragged" : "") + (o.ragged_pairs ? ", ragged pairs" : "") +
                 (o.page_size != 1 ? ", page " + std::to_string(o.page_size) : "");
    info.seed = o.seed;
    info.iters = iters;
    info.warmup = warmup;
    info.shuffle_pages = o.shuffle_pages;
    info.max_batch = o.max_batch;
    info.dirty_flush = o.dirty_flush && gpu;
    info.cache_bytes = double(dev->cache_bytes());
    info.read_buffer_bytes = double(dev->read_bandwidth_buffer_bytes());
    try {
        info.read_gbs = dev->read_bandwidth_gbs();
        info.empty_kernel_us = dev->empty_kernel_us();
    } catch (const Error &e) {
        std::fprintf(stderr, "mla-bench: bandwidth or launch measurement failed: %s\n", e.what());
    }
    print_header(stdout, info);
    if (!gpu && o.backend == "auto" && !why.empty()) std::printf("(CPU backend: %s)\n", why.c_str());

    const std::vector<Case> cases = build_cases(o);
    std::vector<Row> rows;
    HostKv host_kv;
    bool failed = false;
    print_table_header(stdout);
    Rng seeds(o.seed);
    std::map<std::string, size_t> pool_rows;  // largest KV pool per dtype: generated once
    for (const Case &c : cases) pool_rows[c.kv.name] = std::max(pool_rows[c.kv.name], c.max_pool_rows());
    for (const Case &c : cases) {
        const uint64_t shape_seed = seeds.next();
        try {
            ShapeRun shape(*dev, o, c, host_kv, pool_rows[c.kv.name], shape_seed, iters, warmup);
            Row r = shape.run();
            derive(r, info.read_gbs);
            print_row(stdout, r);
            if (o.sweep) print_sweep(stdout, r);
            failed |= !r.check_ok;
            rows.push_back(std::move(r));
        } catch (const Error &e) {
            std::printf("%s: ERROR %s\n", short_dims(c).c_str(), e.what());
            failed = true;
            if (gpu) try { dev->synchronize(); } catch (const Error &) {}
        } catch (const std::bad_alloc &) {
            std::printf("%s: ERROR out of host memory\n", short_dims(c).c_str());
            failed = true;
        }
    }
    host_kv = HostKv();

    TempDir tmp;
    if (o.compare_torch) compare_torch(o, gpu, iters, warmup, o.seed, rows, info, tmp);
    print_geomeans(stdout, rows, gpu, o.suite == "quick" ? "quick" : "base (headline)");
    print_ragged_ratios(stdout, rows, gpu);

    std::string json = o.json;
    if (json.empty() && !o.plot.empty() && !tmp.path.empty()) json = tmp.path + "/bench.json";
    if (!json.empty()) {
        std::string err;
        if (!write_json(json, info, rows, &err)) {
            std::fprintf(stderr, "mla-bench: %s\n", err.c_str());
            failed = true;
        } else if (!o.json.empty()) {
            std::printf("wrote %s\n", json.c_str());
        }
    }
    if (!o.plot.empty()) plot(o, json);

    int bad = 0;
    for (const Row &r : rows) bad += !r.check_ok;
    if (failed)
        std::printf("\nFAILED: %d of %zu shapes failed the check or did not run\n", bad + int(cases.size() - rows.size()),
                    cases.size());
    else
        std::printf("\nall %zu shapes passed the check against the CPU backend\n", rows.size());
    return failed ? 1 : 0;
}

}  // namespace
}  // namespace bench

int main(int argc, char **argv) {
    try {
        return bench::run(argc, argv);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "mla-bench: %s\n", e.what());
        return 1;
    }
}
