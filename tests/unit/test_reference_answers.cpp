// With `[eval] device = "cuda"` the exact policy is answered from the cell's exact reference
// (sim/replay/reference_answers.cpp). Tested on the CPU against a CPU reference: the wrapped policy
// must give, at every evaluated step, what the exact policy stepped token by token gives.
#include <catch2/catch.hpp>

#include <numeric>

#include "../sim/replay/cell_reference.hpp"
#include "../sim/replay/reference_answers.hpp"
#include "helpers.hpp"
#include "kvsim/io/synth.hpp"
#include "kvsim/policies/gpu_replay.hpp"
using namespace kvsim;

TEST_CASE("replay: the exact policy answered from the reference matches the exact policy stepped", "[replay][cuda]") {
  SynthSource src(test::small_synth("heavy_hitter", 120, 16, 1, 4, 2));
  const double scale = src.meta().softmax_scale;
  const Cell cell{0, 1, {2, 3}};
  const int64_t n = 120;
  const cell::Streams s(src, cell, n, scale);
  EvalSpec eval;  // the CPU's double reference stands in for the GPU's
  cell::Reference ref(eval, s, n, scale);
  const std::vector<int64_t> block{5, 17, 60, 120};
  ref.pass(block);

  StreamInfo info;
  info.n = n;
  info.head_dim = 16;
  info.n_queries = 2;
  auto exact = make_policy("exact", Params{}, info);
  CHECK(answers_are_reference(*exact));
  CHECK_FALSE(answers_are_reference(*make_policy("window", [] { Params p; p.set("budget", int64_t(8)); return p; }(), info)));
  auto wrapped = cell::reference_answers(make_policy("exact", Params{}, info), ref, {0, 1});
  auto one = cell::reference_answers(make_policy("exact", Params{}, info), ref, {1});  // gqa = "query_head"

  MatD q(2, 16), q1(1, 16);
  size_t r = 0;
  double worst = 0;
  for (int64_t t = 1; t <= n; ++t) {
    for (auto* p : {exact.get(), wrapped.get(), one.get()})
      p->observe(t - 1, s.keys32.row(t - 1).data(), s.values32.row(t - 1).data());
    CHECK(wrapped->cache_tokens() == exact->cache_tokens());
    if (t != block[r]) continue;
    for (int g = 0; g < 2; ++g) q.row(g) = s.queries_scaled[size_t(g)].row(t - 1);
    q1.row(0) = q.row(1);
    std::vector<Answer> want(2), got(2), got1(1);
    exact->attend(t, q, &want, nullptr);
    wrapped->attend(t, q, &got, nullptr);
    one->attend(t, q1, &got1, nullptr);
    for (int g = 0; g < 2; ++g) {
      worst = std::max(worst, (got[g].z - want[g].z).cwiseAbs().maxCoeff());
      CHECK(got[g].log_tau == Approx(want[g].log_tau).epsilon(1e-12));
      CHECK(got[g].has_kept);
      CHECK(got[g].kept == want[g].kept);
    }
    CHECK((got1[0].z - want[1].z).cwiseAbs().maxCoeff() < 1e-12);
    // Negative control: the two heads' answers differ, so a swapped head would show.
    CHECK((want[0].z - want[1].z).cwiseAbs().maxCoeff() > 1e-6);
    ++r;
  }
  CHECK(r == block.size());
  CHECK(worst < 1e-12);

  // A step the reference's block does not hold, or a query group of another size, is refused.
  std::vector<Answer> out(2);
  CHECK_THROWS_WITH(wrapped->attend(6, q, &out, nullptr), Catch::Contains("step 6 is not in the reference's block"));
  CHECK_THROWS_WITH(one->attend(60, q, &out, nullptr), Catch::Contains("query group"));
}
