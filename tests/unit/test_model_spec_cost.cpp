// --spec auto's rule (runtime/speculative.h, docs/speculative.md "When auto drafts"): the verify-cost
// model from bytes and bandwidths, the expected tokens of a verify step, and spec_decide, against
// values computed by hand.
#include <gtest/gtest.h>

#include "runtime/speculative.h"

using namespace kimi;

TEST(SpecCost, ExpectedTokensAreTheGeometricSum) {
  EXPECT_DOUBLE_EQ(spec_expected_tokens(0.5, 3), 1.875);  // 1 + 1/2 + 1/4 + 1/8
  EXPECT_DOUBLE_EQ(spec_expected_tokens(1.0, 4), 5.0);
  EXPECT_DOUBLE_EQ(spec_expected_tokens(0.0, 5), 1.0);
  EXPECT_DOUBLE_EQ(spec_expected_tokens(0.8, 0), 1.0);
}

TEST(SpecCost, UnionOfExpertsAndVerifyCostFromBytes) {
  VerifyCostModel c;  // CPU only: 100 bytes read once per step, 10 bytes per distinct expert
  c.host_fixed = 100;
  c.host_expert = 10;
  c.n_expert = 8;
  c.top_k = 2;
  EXPECT_DOUBLE_EQ(c.union_experts(0), 2.0);          // one token: its top_k
  EXPECT_DOUBLE_EQ(c.union_experts(1), 3.5);          // 8 (1 - 0.75^2)
  EXPECT_DOUBLE_EQ(c.union_experts(3), 5.46875);      // 8 (1 - 0.75^4)
  EXPECT_DOUBLE_EQ(c.rel(0), 1.0);
  EXPECT_DOUBLE_EQ(c.rel(1), 135.0 / 120.0);          // (100 + 35) / (100 + 20)
  EXPECT_DOUBLE_EQ(c.rel(3), 154.6875 / 120.0);
  // hybrid: the 100 always-read bytes on an accelerator 8x faster, the experts in RAM
  VerifyCostModel h = c;
  h.host_fixed = 0;
  h.dev_fixed = 100;
  h.dev_bw = 8;
  EXPECT_DOUBLE_EQ(h.rel(1), (12.5 + 35) / (12.5 + 20));  // the shared part is cheap: rows cost more
  EXPECT_GT(h.rel(1), c.rel(1));
  // a measured table replaces the model where it has entries
  h.measured = {1.0, 1.3};
  EXPECT_DOUBLE_EQ(h.rel(1), 1.3);
  EXPECT_DOUBLE_EQ(h.rel(2), (12.5 + 8 * (1 - 0.421875) * 10) / 32.5);
}

TEST(SpecCost, DecideTakesTheBestDraftLengthWhereItPays) {
  VerifyCostModel c;
  c.host_fixed = 100;
  c.host_expert = 10;
  c.n_expert = 8;
  c.top_k = 2;
  // p = 0.8: k = 1: 1.8 / 1.125 = 1.6; k = 2: 2.44 / 1.21875 = 2.0021; k = 3: 2.952 / 1.2890625 = 2.2901
  SpecDecision d = spec_decide(c, 0.8, 0.0, 1, 3, false);
  EXPECT_EQ(d.k, 3);
  EXPECT_NEAR(d.speedup, 2.952 / (154.6875 / 120.0), 1e-12);
  d = spec_decide(c, 0.8, 0.0, 1, 2, true);
  EXPECT_EQ(d.k, 2);
  EXPECT_NEAR(d.speedup, 2.44 / (146.25 / 120.0), 1e-12);
  // nothing kept: a verify step only costs (best: k = 1, 1 / 1.125)
  d = spec_decide(c, 0.0, 0.0, 1, 8, true);
  EXPECT_EQ(d.k, 0);
  EXPECT_NEAR(d.speedup, 120.0 / 135.0, 1e-12);
  // the drafting's own time counts: p = 1, k = 2 on a measured table {1, 1.5, 2}: 3 / (2 + 1) = 1.0
  VerifyCostModel m;
  m.measured = {1.0, 1.5, 2.0};
  d = spec_decide(m, 1.0, 1.0, 1, 2, false);
  EXPECT_EQ(d.k, 0);  // break-even is not enough to turn it on
  EXPECT_NEAR(d.speedup, 1.0, 1e-12);
  d = spec_decide(m, 1.0, 0.0, 1, 2, false);  // free drafts: 2 / 1.5 = 1.333 vs 3 / 2 = 1.5
  EXPECT_EQ(d.k, 2);
  EXPECT_NEAR(d.speedup, 1.5, 1e-12);
  d = spec_decide(m, 1.0, 0.0, 2, 2, false);  // k_min
  EXPECT_EQ(d.k, 2);
}

TEST(SpecCost, HysteresisAroundBreakEven) {
  VerifyCostModel m;
  m.measured = {1.0, 1.5};
  // p = 0.53: 1.53 / 1.5 = 1.02: kept on while on (>= 1), not turned on while off (<= 1.05)
  EXPECT_EQ(spec_decide(m, 0.53, 0.0, 1, 1, true).k, 1);
  EXPECT_EQ(spec_decide(m, 0.53, 0.0, 1, 1, false).k, 0);
  // break-even exactly (p = 0.5: 1.5 / 1.5): stays on, stays off
  EXPECT_EQ(spec_decide(m, 0.5, 0.0, 1, 1, true).k, 1);
  EXPECT_EQ(spec_decide(m, 0.5, 0.0, 1, 1, false).k, 0);
  // nothing kept and a step that costs a hair more than a decode step: off
  m.measured = {1.0, 1.001};
  EXPECT_EQ(spec_decide(m, 0.0, 0.0, 1, 1, true).k, 0);
  m.measured = {1.0, 1.5};
  // p = 0.4: 0.933: off either way; p = 0.6: 1.0667 > 1.05: on either way
  EXPECT_EQ(spec_decide(m, 0.4, 0.0, 1, 1, true).k, 0);
  EXPECT_EQ(spec_decide(m, 0.4, 0.0, 1, 1, false).k, 0);
  EXPECT_EQ(spec_decide(m, 0.6, 0.0, 1, 1, true).k, 1);
  EXPECT_EQ(spec_decide(m, 0.6, 0.0, 1, 1, false).k, 1);
  // a wider margin
  EXPECT_EQ(spec_decide(m, 0.6, 0.0, 1, 1, false, 0.1).k, 0);
}
