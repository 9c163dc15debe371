// kvsim: common matrix types.
#pragma once
#include <Eigen/Dense>
#include <cstdint>

namespace kvsim {

/// Row-major float matrix: one row per token, `head_dim` columns (shape [n, d]).
using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// Row-major double matrix (same layout as MatF).
using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VecD = Eigen::VectorXd;
/// Column-major double matrix: a group's attention probabilities [m, G], one contiguous column per query head
/// (written by each head's softmax and read per head by the group aggregation).
using ProbsD = Eigen::MatrixXd;
using VecF = Eigen::VectorXf;

}  // namespace kvsim
