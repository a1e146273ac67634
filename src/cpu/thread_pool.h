// A small fixed pool of worker threads owned by one plan. parallel_for runs a
// function over [0, n) with dynamic index claiming and returns when all ran.
// One caller at a time (a plan is used by one thread at a time).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mla {

class ThreadPool {
public:
    explicit ThreadPool(int threads);  // threads >= 1; the caller is one of them
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int size() const { return int(workers_.size()) + 1; }
    // fn(index, thread_id) for every index in [0, n); thread_id in [0, size()).
    void parallel_for(int n, const std::function<void(int, int)> &fn);

private:
    void worker_main(int thread_id);
    void run_share(int thread_id);

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(int, int)> *job_ = nullptr;
    int job_size_ = 0;
    std::atomic<int> next_{0};
    int busy_ = 0;
    unsigned generation_ = 0;
    bool stop_ = false;
};

}  // namespace mla
