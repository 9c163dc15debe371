// MPI-distributed runs (include/kvsim/replay/mpi.hpp): rank 0 hands out cells and collects rows.
#include "kvsim/replay/mpi.hpp"

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "kvsim/core/error.hpp"
#include "kvsim/io/results.hpp"

#ifdef KVSIM_HAS_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (the deprecated C++ bindings need libmpi_cxx)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace kvsim::mpi {
namespace {

bool g_inited = false;
int g_rank = 0, g_size = 1, g_local = 0;

bool launched() { return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK"); }

std::string where(int rank, int64_t i, const Cell& c) {
  return "rank " + std::to_string(rank) + ", cell " + std::to_string(i) + " (layer " + std::to_string(c.layer) + ", KV head " +
         std::to_string(c.kv_head) + ")";
}

}  // namespace

int rank() { return g_rank; }

std::string pin_gpu() {
  std::vector<std::string> ids;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string cur;
    for (const char* c = v;; ++c) {
      if (*c == ',' || *c == '\0') {
        if (!cur.empty()) ids.push_back(cur);
        cur.clear();
        if (*c == '\0') break;
      } else if (*c != ' ') {
        cur += *c;
      }
    }
  } else {
    for (int i = 0; i < 64; ++i)
      if (std::filesystem::exists("/dev/nvidia" + std::to_string(i))) ids.push_back(std::to_string(i));
  }
  if (ids.empty()) return "";
  const std::string chosen = ids[size_t(g_local) % ids.size()];
  setenv("CUDA_VISIBLE_DEVICES", chosen.c_str(), 1);
  return chosen;
}
int size() { return g_size; }
int local_rank() { return g_local; }

#ifndef KVSIM_HAS_MPI

void init(int*, char***) {
  // A launcher around a build without MPI would start independent copies of the same run (on the
  // same --out, where all but one fail with "holds an unfinished run"): refuse before any work.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = std::getenv(var);
    if (v && std::atol(v) > 1) {
      std::fprintf(stderr,
                   "kvsim: error: started by an MPI launcher with %s ranks (%s=%s), but this kvsim was built without MPI "
                   "(configure found no MPI or was given -DKVSIM_MPI=OFF: install libopenmpi-dev and rebuild with MPI, or run kvsim "
                   "without mpirun)\n",
                   v, var, v);
      std::exit(2);
    }
  }
}
void finalize() {}
bool agree(bool value) { return value; }
bool built_with_mpi() { return false; }
void abort(int) {}
std::unique_ptr<CellScheduler> scheduler() { throw Error("kvsim was built without MPI"); }

#else

namespace {

enum Tag { kRequest = 1, kAssign = 2, kResult = 3, kRows = 4, kError = 5 };

/// One finished cell on a worker rank: its rows, or the error that stopped it.
struct Finished {
  int64_t cell = -1;
  std::vector<std::vector<MetricRow>> rows;
  std::string error;
};

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "kvsim: error: %s\n", msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

void send_rows(int64_t cell, const std::vector<std::vector<MetricRow>>& rows) {
  int64_t hdr[2] = {cell, int64_t(rows.size())};
  MPI_Send(hdr, 2, MPI_INT64_T, 0, kResult, MPI_COMM_WORLD);
  for (const auto& rp : rows) {
    const size_t bytes = rp.size() * sizeof(MetricRow);
    if (bytes > size_t(INT_MAX)) throw Error("cell " + std::to_string(cell) + ": rows exceed one MPI message (2 GiB)");
    MPI_Send(rp.data(), int(bytes), MPI_BYTE, 0, kRows, MPI_COMM_WORLD);
  }
}

/// Waits for every rank (MPI_Ibarrier, polled with sleeps so a waiting rank does not spin on a core
/// another rank computes on). Ends each distributed replay: no rank's requests for the next sequence
/// can reach rank 0 while it still serves this one.
void quiet_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

std::vector<std::vector<MetricRow>> recv_rows(int from, int64_t policies) {
  std::vector<std::vector<MetricRow>> rows(static_cast<size_t>(policies));
  for (auto& rp : rows) {
    MPI_Status st;
    MPI_Probe(from, kRows, MPI_COMM_WORLD, &st);
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    rp.resize(size_t(bytes) / sizeof(MetricRow));
    MPI_Recv(rp.data(), bytes, MPI_BYTE, from, kRows, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  return rows;
}

/// A worker rank: asks for a cell whenever one of its `threads` slots is free, replays it on a thread,
/// sends the rows back; stops when rank 0 answers −1 and its cells are sent.
void work(const Experiment& ex, const StreamSource& src, const std::vector<Cell>& cells, int64_t n, int threads) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Finished> done;
  std::map<int64_t, std::thread> running;
  bool stopping = false;
  for (;;) {
    while (!stopping && int(running.size()) < threads) {
      const int one = 1;
      int64_t i = -1;
      MPI_Send(&one, 1, MPI_INT, 0, kRequest, MPI_COMM_WORLD);
      MPI_Recv(&i, 1, MPI_INT64_T, 0, kAssign, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (i < 0 || i >= int64_t(cells.size())) {
        stopping = true;
        break;
      }
      running[i] = std::thread([&, i] {
        Finished f;
        f.cell = i;
        try {
          f.rows.resize(ex.policies.size());
          replay_cell(ex, src, cells[size_t(i)], n, f.rows);
        } catch (const std::bad_alloc&) {
          f.error = "out of memory";
        } catch (const std::exception& e) {
          f.error = e.what();
        }
        std::lock_guard<std::mutex> lk(mu);
        done.push_back(std::move(f));
        cv.notify_one();
      });
    }
    if (running.empty()) return;
    std::deque<Finished> batch;
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return !done.empty(); });
      batch.swap(done);
    }
    for (auto& f : batch) {
      running[f.cell].join();
      running.erase(f.cell);
      if (!f.error.empty()) {
        const std::string msg = where(g_rank, f.cell, cells[size_t(f.cell)]) + ": " + f.error;
        MPI_Send(msg.data(), int(msg.size()), MPI_CHAR, 0, kError, MPI_COMM_WORLD);
        std::this_thread::sleep_for(std::chrono::seconds(5));  // rank 0 prints it and aborts the job
        fail(msg);
      }
      send_rows(f.cell, f.rows);
    }
  }
}

/// Rank 0's main thread: answers the worker ranks' requests with cells from `take` (−1 = none left,
/// which stops that rank), passes their rows to `deliver`, and ends the job on any error (a worker's
/// report, rank 0's own through `failed`/`local_error`, or an exception here).
void serve(const std::function<int64_t()>& take,
           const std::function<void(size_t, std::vector<std::vector<MetricRow>>&&)>& deliver,
           const std::atomic<size_t>& finished, size_t to_compute, const std::atomic<bool>& failed,
           const std::function<std::string()>& local_error) {
  int stops = 0;
  try {
    while (finished < to_compute || stops < g_size - 1) {
      if (failed) fail(local_error());
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // measured: 200 µs polls cost 5% of a 2-rank run on 2 cores
        continue;
      }
      if (st.MPI_TAG == kRequest) {
        int dummy = 0;
        MPI_Recv(&dummy, 1, MPI_INT, st.MPI_SOURCE, kRequest, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        const int64_t i = failed ? -1 : take();
        stops += i < 0;
        MPI_Send(&i, 1, MPI_INT64_T, st.MPI_SOURCE, kAssign, MPI_COMM_WORLD);
      } else if (st.MPI_TAG == kResult) {
        int64_t hdr[2];
        MPI_Recv(hdr, 2, MPI_INT64_T, st.MPI_SOURCE, kResult, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        deliver(size_t(hdr[0]), recv_rows(st.MPI_SOURCE, hdr[1]));
      } else if (st.MPI_TAG == kError) {
        int len = 0;
        MPI_Get_count(&st, MPI_CHAR, &len);
        std::string msg(size_t(len), '\0');
        MPI_Recv(msg.data(), len, MPI_CHAR, st.MPI_SOURCE, kError, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        fail(msg);
      }
    }
  } catch (const std::exception& e) {
    fail(std::string("rank 0: ") + e.what());
  }
}

}  // namespace

void init(int* argc, char*** argv) {
  if (!launched()) return;
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  g_inited = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &g_local);
  MPI_Comm_free(&node);
}

void finalize() {
  if (g_inited) MPI_Finalize();
  g_inited = false;
}

bool built_with_mpi() { return true; }

bool agree(bool value) {
  if (!g_inited || g_size == 1) return value;
  int v = value ? 1 : 0;
  MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return v != 0;
}

void abort(int status) {
  if (!g_inited) return;
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, status);
}

namespace {

class MpiScheduler final : public CellScheduler {
 public:
  void run(const RunPlan& plan, RowSink& sink, int threads, const Progress& progress) override;
};

void MpiScheduler::run(const RunPlan& plan, RowSink& sink, int threads, const Progress& progress) {
  const Experiment& ex = *plan.ex;
  const StreamSource& src = *plan.src;
  const std::vector<Cell>& cells = plan.cells;
  const int64_t n = plan.n;
  if (g_rank != 0) {
    work(ex, src, cells, n, threads);
    quiet_barrier();
    return;
  }
  std::atomic<size_t> next{0}, finished{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string local_error;
  size_t to_compute = 0;
  for (size_t i = 0; i < cells.size(); ++i) to_compute += !sink.cell_done(i);
  int shown = int(sink.cells_resumed());
  auto take = [&]() -> int64_t {
    for (;;) {
      const size_t i = next++;
      if (i >= cells.size()) return -1;
      if (!sink.cell_done(i)) return int64_t(i);
    }
  };
  auto deliver = [&](size_t i, std::vector<std::vector<MetricRow>>&& rows) {
    sink.write_cell(i, std::move(rows));
    std::lock_guard<std::mutex> lk(mu);
    ++finished;
    if (progress) progress(++shown, int(cells.size()));
  };
  auto local = [&] {
    for (int64_t i; !failed && (i = take()) >= 0;) {
      try {
        std::vector<std::vector<MetricRow>> rows(ex.policies.size());
        replay_cell(ex, src, cells[size_t(i)], n, rows);
        deliver(size_t(i), std::move(rows));
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(mu);
        if (local_error.empty()) local_error = where(0, i, cells[size_t(i)]) + ": " + e.what();
        failed = true;
      }
    }
  };
  // runtime.mpi_coordinator_only (KVSIM_MPI_COORDINATOR_ONLY=1): rank 0 hands out cells but computes
  // none (tests use it to make a worker rank meet a failing cell).
  const int local_threads = ex.runtime.mpi_coordinator_only ? 0 : std::max(1, threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < local_threads; ++t) pool.emplace_back(local);
  serve(take, deliver, finished, to_compute, failed, [&] {
    std::lock_guard<std::mutex> lk(mu);
    return local_error;
  });
  for (auto& t : pool) t.join();
  if (failed) fail(local_error);
  quiet_barrier();
}

}  // namespace

std::unique_ptr<CellScheduler> scheduler() { return std::make_unique<MpiScheduler>(); }

#endif

}  // namespace kvsim::mpi
