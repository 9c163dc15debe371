// kvsim: MPI-distributed runs (`mpirun -n N ./build/kvsim run CONFIG`; docs/cli.md "Clusters").
//
// Rank 0 coordinates and computes: it hands out (layer, KV head) cells one at a time to whichever
// rank asks (a rank that finishes a cell asks for the next: dynamic balancing), receives every
// finished cell's rows, and alone writes the results (and the checkpoint, so --resume works as for a
// single process). Every rank replays its cells on its own --threads workers. A cell's rows depend only
// on the config and the cell, so the results are identical to `kvsim run --threads 1`.
// With KVSIM_MPI_COORDINATOR_ONLY=1 in the environment rank 0 only coordinates (computes no cell).
// An error in any rank is printed by rank 0 with the rank, the cell and the message, then MPI_Abort
// ends every rank with a non-zero status (no rank waits forever).
//
// kvsim initializes MPI only when an MPI launcher started it (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK in the environment); a plain `kvsim run` never touches MPI. Built without MPI
// (libopenmpi-dev absent, or -DKVSIM_MPI=OFF), size() is 1 and everything runs in one process; such a
// build started by a launcher with more than one rank refuses in init() (one line, exit 2) instead of
// running independent copies of the same run.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "kvsim/replay/engine.hpp"

namespace kvsim::mpi {

/// MPI_Init_thread (funneled: only each rank's main thread calls MPI) when launched by mpirun.
void init(int* argc, char*** argv);
/// MPI_Finalize when init() initialized MPI.
void finalize();
int rank();        ///< this process's rank (0 without MPI)
int size();        ///< ranks in the job (1 without MPI)
int local_rank();  ///< rank among the job's processes on this node (the GPU index base)
/// Whether kvsim was built with MPI (`kvsim --version` says so).
bool built_with_mpi();
/// Ends every rank of the job with `status` (MPI_Abort); returns only without MPI.
void abort(int status);
/// `--device cuda` under MPI: rank r keeps one GPU visible, number (local_rank mod visible GPUs) of
/// CUDA_VISIBLE_DEVICES (or of /dev/nvidiaN when that is unset), by setting CUDA_VISIBLE_DEVICES before
/// the CUDA module loads. Returns the GPU chosen ("" when none is visible: --device cuda then fails).
std::string pin_gpu();

/// Rank 0's `value`, on every rank (MPI_Bcast; `value` itself without MPI): decisions that read the
/// output folder are rank 0's, so ranks that do not see it cannot diverge.
bool agree(bool value);

/// The distributed schedule (engine.hpp's job_scheduler() when size() > 1): rank 0 hands out the
/// plan's cells the sink does not hold, computes on its own threads, passes every finished cell's
/// rows to the sink and reports progress; other ranks compute what they are given (their sink stays
/// empty).
std::unique_ptr<CellScheduler> scheduler();

}  // namespace kvsim::mpi
