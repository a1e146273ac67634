// mla-bench: printing the table, the JSON report, and reading JSON back.
#include "bench_report.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace bench {

namespace {

std::string fmt(const char *f, double v) {
    if (!std::isfinite(v)) return "-";
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string check_text(const Row &r) {
    if (!r.check_note.empty() && r.check_ok) return r.check_note;
    if (r.check_ok) return "ok";
    char buf[64];
    std::snprintf(buf, sizeof buf, "FAIL %.2e", r.check_err);
    return buf;
}

std::string kv_len_text(const Row &r) { return (r.ragged ? "~" : "") + std::to_string(r.kv_len); }

// The shape columns every table starts with, and their headings.
void print_shape_header(std::FILE *f) {
    std::fprintf(f, "%-6s %5s %7s %4s %2s %4s |", "kv", "batch", "kv_len", "hds", "q", "page");
}
void print_shape(std::FILE *f, const Row &r, const std::string &kv_len) {
    std::fprintf(f, "%-6s %5d %7s %4d %2d %4d |", r.kv_dtype.c_str(), r.batch, kv_len.c_str(), r.heads, r.q_len,
                 r.page_size);
}

}  // namespace

void derive(Row &r, double read_gbs) {
    if (std::isfinite(r.exec_us) && r.exec_us > 0) {
        r.gbs = r.bytes / (r.exec_us * 1e3);
        r.tflops = r.flops / (r.exec_us * 1e6);
        r.bw_fraction = read_gbs > 0 ? r.gbs / read_gbs : kNaN;
    }
}

void print_header(std::FILE *f, const RunInfo &in) {
    std::fprintf(f, "mla-bench, libmla %s (%s)  %s\n", in.tool_version.c_str(), in.git.c_str(), in.date.c_str());
    std::fprintf(f, "backend %s: %s\n", in.backend.c_str(), in.device.c_str());
    std::fprintf(f, "suite %s, iters %d (+%d warm-up), seed %llu%s%s", in.suite.c_str(), in.iters, in.warmup, in.seed,
                 in.shuffle_pages ? ", shuffled page tables" : "", in.dirty_flush ? ", L2 flushed by a memset" : "");
    if (in.max_batch > 0) std::fprintf(f, ", plans for at least %d sequences", in.max_batch);
    std::fprintf(f, "\n");
    if (in.read_gbs > 0)
        std::fprintf(f, "streaming read bandwidth (this run, %.0f MB buffer): %.1f GB/s; cache not to serve the KV: %.0f MB\n",
                     in.read_buffer_bytes / 1e6, in.read_gbs, in.cache_bytes / 1e6);
    else
        std::fprintf(f, "streaming read bandwidth: not measured\n");
    if (in.empty_kernel_us > 0)
        std::fprintf(f, "empty kernel (this run, one CTA, events): %.1f us, the floor under one launch (dmeta_us)\n",
                     in.empty_kernel_us);
}

void print_table_header(std::FILE *f) {
    std::fprintf(f, "\n");
    print_shape_header(f);
    std::fprintf(f, " %9s %9s %9s %9s %9s | %9s %8s %6s %7s | %11s | %s\n", "exec_us", "graph_us", "g+meta", "meta_us",
                 "dmeta_us", "MB", "GB/s", "%bw", "TFLOP/s", "items/split", "check");
}

void print_row(std::FILE *f, const Row &r) {
    char sched[32];
    std::snprintf(sched, sizeof sched, "%d/%d", r.work_items, r.max_splits);
    print_shape(f, r, kv_len_text(r));
    std::fprintf(f, " %9s %9s %9s %9s %9s | %9s %8s %6s %7s | %11s | %s%s%s\n", fmt("%.1f", r.exec_us).c_str(),
                 fmt("%.1f", r.graph_us).c_str(), fmt("%.1f", r.graph_meta_us).c_str(), fmt("%.1f", r.meta_us).c_str(),
                 fmt("%.1f", r.dmeta_us).c_str(), fmt("%.2f", r.bytes / 1e6).c_str(),
                 fmt("%.1f", r.gbs).c_str(), fmt("%.1f", r.bw_fraction * 100).c_str(), fmt("%.3f", r.tflops).c_str(),
                 sched, check_text(r).c_str(), r.note.empty() ? "" : "  # ", r.note.c_str());
    std::fflush(f);
}

void print_sweep(std::FILE *f, const Row &r) {
    std::fprintf(f, "       sweep: auto %s us (items %d, split rows %d, max_splits %d, target_blocks %d, block %d tok, %d workers)\n",
                 fmt("%.1f", r.exec_us).c_str(), r.work_items, r.split_rows, r.max_splits, r.target_blocks,
                 r.block_tokens, r.workers);
    std::string line = "             ";
    double best = kNaN;
    int best_splits = 0;
    for (const SweepPoint &p : r.sweep) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "  %d: %s%s", p.splits, fmt("%.1f", p.us).c_str(), p.ok ? "" : " (FAIL)");
        line += buf;
        if (std::isfinite(p.us) && p.ok && (!std::isfinite(best) || p.us < best)) {
            best = p.us;
            best_splits = p.splits;
        }
    }
    std::fprintf(f, "%s\n", line.c_str());
    if (std::isfinite(best) && std::isfinite(r.exec_us))
        std::fprintf(f, "             best forced: %d splits %.1f us = %.2fx of auto\n", best_splits, best, best / r.exec_us);
    std::fflush(f);
}

void print_torch(std::FILE *f, const std::vector<Row> &rows) {
    std::fprintf(f, "\nPyTorch comparison (ratio = torch_us / mla_us, > 1 means libmla is faster)\n");
    print_shape_header(f);
    std::fprintf(f, " %10s %10s %8s\n", "mla_us", "torch_us", "ratio");
    for (const Row &r : rows) {
        print_shape(f, r, kv_len_text(r));
        std::fprintf(f, " %10s %10s %8s\n", fmt("%.1f", r.exec_us).c_str(), fmt("%.1f", r.torch_us).c_str(),
                     fmt("%.2f", r.torch_us / r.exec_us).c_str());
    }
}

std::map<std::string, std::pair<double, double>> geomeans(const std::vector<Row> &rows) {
    std::map<std::string, std::pair<double, double>> out;
    std::map<std::string, double> log_exec, log_graph;
    std::map<std::string, int> n_exec, n_graph;
    for (const Row &r : rows) {
        if (!r.headline) continue;
        if (std::isfinite(r.exec_us) && r.exec_us > 0) {
            log_exec[r.kv_dtype] += std::log(r.exec_us);
            ++n_exec[r.kv_dtype];
        }
        if (std::isfinite(r.graph_us) && r.graph_us > 0) {
            log_graph[r.kv_dtype] += std::log(r.graph_us);
            ++n_graph[r.kv_dtype];
        }
    }
    for (const auto &kv : n_exec) {
        const double g = n_graph.count(kv.first) && n_graph[kv.first] == kv.second
                             ? std::exp(log_graph[kv.first] / kv.second) : kNaN;
        out[kv.first] = {std::exp(log_exec[kv.first] / kv.second), g};
    }
    return out;
}

void print_geomeans(std::FILE *f, const std::vector<Row> &rows, bool gpu, const std::string &label) {
    const auto g = geomeans(rows);
    if (g.empty()) return;
    int n = 0;
    for (const Row &r : rows) n += r.headline;
    std::fprintf(f, "\ngeometric mean of execute times over the %s shapes (%d rows):\n", label.c_str(), n);
    for (const auto &kv : g) {
        std::fprintf(f, "  %-6s exec %s us", kv.first.c_str(), fmt("%.1f", kv.second.first).c_str());
        if (gpu) std::fprintf(f, "   graph %s us", fmt("%.1f", kv.second.second).c_str());
        std::fprintf(f, "\n");
    }
}

void print_ragged_ratios(std::FILE *f, const std::vector<Row> &rows, bool gpu) {
    auto twin = [](const Row &a, const Row &b) {
        return a.kv_dtype == b.kv_dtype && a.q_dtype == b.q_dtype && a.batch == b.batch && a.kv_len == b.kv_len &&
               a.heads == b.heads && a.q_len == b.q_len && a.page_size == b.page_size && a.shuffled == b.shuffled;
    };
    int pairs = 0, within = 0;
    for (const Row &r : rows) {
        if (!r.ragged) continue;
        const Row *u = nullptr;
        for (const Row &c : rows)
            if (!c.ragged && twin(c, r)) u = &c;
        if (!u) continue;
        if (pairs++ == 0) {
            std::fprintf(f, "\nragged / uniform (same total tokens; target: within 1.10)\n");
            print_shape_header(f);
            std::fprintf(f, " %10s %10s %7s", "uniform_us", "ragged_us", "exec");
            if (gpu) std::fprintf(f, " %7s", "graph");
            std::fprintf(f, "\n");
        }
        const double ratio = r.exec_us / u->exec_us;
        within += ratio <= 1.10;
        print_shape(f, r, std::to_string(r.kv_len));  // the mean length both share
        std::fprintf(f, " %10s %10s %7s", fmt("%.1f", u->exec_us).c_str(), fmt("%.1f", r.exec_us).c_str(),
                     fmt("%.3f", ratio).c_str());
        if (gpu) std::fprintf(f, " %7s", fmt("%.3f", r.graph_us / u->graph_us).c_str());
        std::fprintf(f, "\n");
    }
    if (pairs) std::fprintf(f, "%d of %d ragged batches within 1.10 of uniform (execute)\n", within, pairs);
}

std::string json_escape(const std::string &s) {
    std::string o;
    for (unsigned char c : s) {
        switch (c) {
            case '"': o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            case '\t': o += "\\t"; break;
            case '\r': o += "\\r"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    o += buf;
                } else {
                    o += char(c);
                }
        }
    }
    return o;
}

namespace {

std::string jnum(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}
std::string jstr(const std::string &s) { return "\"" + json_escape(s) + "\""; }
std::string jbool(bool b) { return b ? "true" : "false"; }

}  // namespace

bool write_json(const std::string &path, const RunInfo &in, const std::vector<Row> &rows, std::string *error) {
    std::ostringstream o;
    o << "{\n";
    o << "  \"tool\": \"mla-bench\",\n";
    o << "  \"version\": " << jstr(in.tool_version) << ",\n";
    o << "  \"git\": " << (in.git.empty() || in.git == "unknown" ? "null" : jstr(in.git)) << ",\n";
    o << "  \"date\": " << jstr(in.date) << ",\n";
    o << "  \"backend\": " << jstr(in.backend) << ",\n";
    o << "  \"device\": " << jstr(in.device) << ",\n";
    o << "  \"suite\": " << jstr(in.suite) << ",\n";
    o << "  \"read_bandwidth_gbs\": " << jnum(in.read_gbs > 0 ? in.read_gbs : kNaN) << ",\n";
    o << "  \"read_bandwidth_buffer_bytes\": " << jnum(in.read_buffer_bytes) << ",\n";
    o << "  \"cache_bytes\": " << jnum(in.cache_bytes) << ",\n";
    o << "  \"empty_kernel_us\": " << jnum(in.empty_kernel_us > 0 ? in.empty_kernel_us : kNaN) << ",\n";
    o << "  \"seed\": " << in.seed << ",\n";
    o << "  \"iters\": " << in.iters << ",\n";
    o << "  \"warmup\": " << in.warmup << ",\n";
    o << "  \"shuffle_pages\": " << jbool(in.shuffle_pages) << ",\n";
    o << "  \"max_batch\": " << in.max_batch << ",\n";
    o << "  \"dirty_flush\": " << jbool(in.dirty_flush) << ",\n";
    if (!in.torch_status.empty()) {
        o << "  \"torch\": {\"status\": " << jstr(in.torch_status) << ", \"device\": " << jstr(in.torch_device)
          << "},\n";
    }
    o << "  \"geomean_us\": {";
    bool first = true;
    for (const auto &kv : geomeans(rows)) {
        o << (first ? "" : ", ") << jstr(kv.first) << ": {\"exec\": " << jnum(kv.second.first)
          << ", \"graph\": " << jnum(kv.second.second) << "}";
        first = false;
    }
    o << "},\n";
    o << "  \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
        const Row &r = rows[i];
        o << (i ? ",\n" : "\n") << "    {";
        o << "\"kv_dtype\": " << jstr(r.kv_dtype) << ", \"q_dtype\": " << jstr(r.q_dtype) << ", \"batch\": " << r.batch
          << ", \"kv_len\": " << r.kv_len << ", \"heads\": " << r.heads << ", \"q_len\": " << r.q_len
          << ", \"page_size\": " << r.page_size << ", \"ragged\": " << jbool(r.ragged)
          << ", \"shuffled_pages\": " << jbool(r.shuffled) << ", \"headline\": " << jbool(r.headline)
          << ", \"total_kv_tokens\": " << r.total_kv << ", \"total_q_tokens\": " << r.total_q
          << ",\n     \"exec_us\": " << jnum(r.exec_us) << ", \"exec_min_us\": " << jnum(r.exec_min_us)
          << ", \"graph_us\": " << jnum(r.graph_us) << ", \"graph_meta_us\": " << jnum(r.graph_meta_us)
          << ", \"metadata_host_us\": " << jnum(r.meta_us) << ", \"metadata_device_us\": " << jnum(r.dmeta_us)
          << ", \"kv_copies\": " << r.kv_copies << ", \"cache_flushed\": " << jbool(r.flushed)
          << ",\n     \"bytes\": " << jnum(r.bytes) << ", \"flops\": " << jnum(r.flops) << ", \"gbs\": " << jnum(r.gbs)
          << ", \"bw_fraction\": " << jnum(r.bw_fraction) << ", \"tflops\": " << jnum(r.tflops)
          << ",\n     \"schedule\": {\"work_items\": " << r.work_items << ", \"split_rows\": " << r.split_rows
          << ", \"max_splits\": " << r.max_splits << ", \"target_blocks\": " << r.target_blocks
          << ", \"block_tokens\": " << r.block_tokens << ", \"workers\": " << r.workers << "}"
          << ", \"check_ok\": " << jbool(r.check_ok) << ", \"check_err\": " << jnum(r.check_err)
          << ", \"torch_us\": " << jnum(r.torch_us)
          << ", \"torch_ratio\": " << jnum(r.torch_us / r.exec_us);
        if (!r.note.empty()) o << ", \"note\": " << jstr(r.note);
        if (r.ragged) {
            o << ",\n     \"kv_lens\": [";
            for (size_t b = 0; b < r.kv_lens.size(); ++b) o << (b ? "," : "") << r.kv_lens[b];
            o << "]";
        }
        if (!r.sweep.empty()) {
            o << ",\n     \"sweep\": [";
            for (size_t k = 0; k < r.sweep.size(); ++k) {
                const SweepPoint &p = r.sweep[k];
                o << (k ? ", " : "") << "{\"num_splits\": " << p.splits << ", \"exec_us\": " << jnum(p.us)
                  << ", \"work_items\": " << p.work_items << ", \"check_ok\": " << jbool(p.ok)
                  << ", \"check_err\": " << jnum(p.err) << "}";
            }
            o << "]";
        }
        o << "}";
    }
    o << "\n  ]\n}\n";
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) {
        if (error) *error = "cannot open " + path + ": " + std::strerror(errno);
        return false;
    }
    f << o.str();
    f.close();
    if (!f) {
        if (error) *error = "cannot write " + path;
        return false;
    }
    return true;
}

// ---- JSON reader ---------------------------------------------------------

const JValue *JValue::get(const std::string &key) const {
    if (type != Object) return nullptr;
    for (const auto &kv : obj)
        if (kv.first == key) return &kv.second;
    return nullptr;
}

namespace {

class Parser {
public:
    explicit Parser(const std::string &s) : s_(s) {}

    bool parse(JValue *out, std::string *error) {
        if (!value(out, 0) || (skip_ws(), pos_ != s_.size())) {
            if (error) *error = "JSON syntax error near byte " + std::to_string(pos_);
            return false;
        }
        return true;
    }

private:
    void skip_ws() {
        while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    bool literal(const char *lit) {
        const size_t n = std::strlen(lit);
        if (s_.compare(pos_, n, lit) != 0) return false;
        pos_ += n;
        return true;
    }
    bool value(JValue *v, int depth) {
        if (depth > 64) return false;
        skip_ws();
        if (pos_ >= s_.size()) return false;
        const char c = s_[pos_];
        if (c == '{') return object(v, depth);
        if (c == '[') return array(v, depth);
        if (c == '"') {
            v->type = JValue::String;
            return string(&v->str);
        }
        if (literal("true")) { v->type = JValue::Bool; v->b = true; return true; }
        if (literal("false")) { v->type = JValue::Bool; v->b = false; return true; }
        if (literal("null")) { v->type = JValue::Null; return true; }
        if (literal("NaN")) { v->type = JValue::Null; return true; }  // Python's json.dump default
        return number(v);
    }
    bool number(JValue *v) {
        const char *begin = s_.c_str() + pos_;
        char *end = nullptr;
        const double d = std::strtod(begin, &end);
        if (end == begin) return false;
        pos_ += size_t(end - begin);
        v->type = JValue::Number;
        v->num = d;
        return true;
    }
    bool string(std::string *out) {
        ++pos_;  // opening quote
        while (pos_ < s_.size()) {
            const char c = s_[pos_++];
            if (c == '"') return true;
            if (c != '\\') {
                *out += c;
                continue;
            }
            if (pos_ >= s_.size()) return false;
            const char e = s_[pos_++];
            switch (e) {
                case 'n': *out += '\n'; break;
                case 't': *out += '\t'; break;
                case 'r': *out += '\r'; break;
                case 'b': *out += '\b'; break;
                case 'f': *out += '\f'; break;
                case 'u': {
                    if (pos_ + 4 > s_.size()) return false;
                    const unsigned code = unsigned(std::strtoul(s_.substr(pos_, 4).c_str(), nullptr, 16));
                    pos_ += 4;
                    *out += code < 0x80 ? char(code) : '?';  // only ASCII matters here
                    break;
                }
                default: *out += e;
            }
        }
        return false;
    }
    bool array(JValue *v, int depth) {
        v->type = JValue::Array;
        ++pos_;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return true; }
        for (;;) {
            JValue item;
            if (!value(&item, depth + 1)) return false;
            v->arr.push_back(std::move(item));
            skip_ws();
            if (pos_ >= s_.size()) return false;
            if (s_[pos_] == ',') { ++pos_; continue; }
            if (s_[pos_] == ']') { ++pos_; return true; }
            return false;
        }
    }
    bool object(JValue *v, int depth) {
        v->type = JValue::Object;
        ++pos_;
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return true; }
        for (;;) {
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != '"') return false;
            std::string key;
            if (!string(&key)) return false;
            skip_ws();
            if (pos_ >= s_.size() || s_[pos_] != ':') return false;
            ++pos_;
            JValue item;
            if (!value(&item, depth + 1)) return false;
            v->obj.emplace_back(std::move(key), std::move(item));
            skip_ws();
            if (pos_ >= s_.size()) return false;
            if (s_[pos_] == ',') { ++pos_; continue; }
            if (s_[pos_] == '}') { ++pos_; return true; }
            return false;
        }
    }

    const std::string &s_;
    size_t pos_ = 0;
};

}  // namespace

bool parse_json(const std::string &text, JValue *out, std::string *error) {
    *out = JValue();
    return Parser(text).parse(out, error);
}

}  // namespace bench
