// --spec auto's rule (runtime/speculative.h, docs/speculative.md "When auto drafts"): the verify-cost
// model from bytes and bandwidths, the expected tokens of a verify step, and spec_decide, against
// values computed by hand.
#include <gtest/gtest.h>

#include <cmath>

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

// kimi serve: the marginal cost of one sequence's drafts in a shared step (VerifyCostModel::batch_rel)
// and spec_decide_batch's rule, S = E(p, k) / (1 + n (batch_rel(rows, k) - 1 + c)): the sequence charged
// its share of the step plus the whole time its drafts add.
TEST(SpecCost, BatchMarginalCostAndDecision) {
  VerifyCostModel c;  // 100 bytes read once per step, 10 per distinct expert, 2 of 8 experts per token
  c.host_fixed = 100;
  c.host_expert = 10;
  c.n_expert = 8;
  c.top_k = 2;
  // a step of R rows reads 100 + 10 * 8 (1 - 0.75^R): R = 1: 120, 2: 135, 3: 146.25, 4: 154.6875
  EXPECT_DOUBLE_EQ(c.rows_rel(1), 1.0);
  EXPECT_DOUBLE_EQ(c.rows_rel(2), 135.0 / 120.0);
  EXPECT_DOUBLE_EQ(c.rows_rel(4), 154.6875 / 120.0);
  EXPECT_DOUBLE_EQ(c.batch_rel(1, 1), c.rel(1));
  EXPECT_DOUBLE_EQ(c.batch_rel(2, 2), 154.6875 / 135.0);  // two drafts added to a step of two rows
  EXPECT_DOUBLE_EQ(c.batch_rel(3, 0), 1.0);
  // the more rows the step has already, the less k more cost (their picks overlap the step's)
  EXPECT_LT(c.batch_rel(4, 2), c.batch_rel(2, 2));
  EXPECT_LT(c.batch_rel(2, 2), c.batch_rel(1, 2));

  // one row, one sequence: spec_decide's rule exactly
  for (double p : {0.0, 0.3, 0.8, 1.0})
    for (bool on : {false, true}) {
      const SpecDecision a = spec_decide(c, p, 0.01, 1, 4, on), b = spec_decide_batch(c, p, 0.01, 1, 4, on, 1, 1);
      EXPECT_EQ(a.k, b.k) << p;
      EXPECT_DOUBLE_EQ(a.speedup, b.speedup) << p;
    }

  // two sequences in a step of two rows, p = 0.8, drafts free:
  // k = 1: 1.8 / (1 + 2 (146.25 / 135 - 1)) = 1.54286; k = 2: 2.44 / (1 + 2 (154.6875 / 135 - 1)) = 1.88903
  SpecDecision d = spec_decide_batch(c, 0.8, 0.0, 1, 2, false, 2, 2);
  EXPECT_EQ(d.k, 2);
  EXPECT_NEAR(d.speedup, 2.44 / (1 + 2 * (154.6875 / 135.0 - 1)), 1e-12);
  d = spec_decide_batch(c, 0.8, 0.0, 1, 1, false, 2, 2);
  EXPECT_EQ(d.k, 1);
  EXPECT_NEAR(d.speedup, 1.8 / (1 + 2 * (146.25 / 135.0 - 1)), 1e-12);
  // break-even is where the step's throughput stops growing: k = 1 beside 3 other sequences (4 rows,
  // rel = 1.0409): throughput (n - 1 + E) / (n rel) and S are both above 1 (p = 0.2, 0.3) or both not
  for (double p : {0.05, 0.1, 0.2, 0.3}) {
    const double rel = c.batch_rel(4, 1), e = 1 + p;
    const SpecDecision b = spec_decide_batch(c, p, 0.0, 1, 1, true, 4, 4);
    EXPECT_EQ(b.speedup >= 1.0, (3 + e) / (4 * rel) >= 1.0) << p;
    EXPECT_NEAR(b.speedup, e / (1 + 4 * (rel - 1)), 1e-12) << p;
  }
  // a draft that is never right never pays, whatever the batch (the step only gets slower)
  for (int rows : {1, 2, 4, 64, 512})
    for (int seqs : {1, 4}) {
      EXPECT_EQ(spec_decide_batch(c, 0.0, 0.0, 1, 8, false, rows, seqs).k, 0) << rows;
      EXPECT_LE(spec_decide_batch(c, 0.0, 0.0, 1, 8, false, rows, seqs).speedup, 1.0) << rows;
    }

  // hybrid (the 100 always-read bytes on an accelerator 8x faster, experts in RAM), p = 0.5, k = 1:
  // alone the draft row costs (12.5 + 35) / (12.5 + 20) = 1.4615 of the step: 1.5 / 1.4615 = 1.026,
  // not above 1.05; beside a prompt chunk of 64 rows (every expert read anyway) it costs nearly nothing
  VerifyCostModel h = c;
  h.host_fixed = 0;
  h.dev_fixed = 100;
  d = spec_decide_batch(h, 0.5, 0.0, 1, 1, false, 1, 1);
  EXPECT_EQ(d.k, 0);
  EXPECT_NEAR(d.speedup, 1.5 * 32.5 / 47.5, 1e-12);
  d = spec_decide_batch(h, 0.5, 0.0, 1, 1, false, 65, 2);
  const double t65 = 12.5 + 80 * (1 - std::pow(0.75, 65)), t66 = 12.5 + 80 * (1 - std::pow(0.75, 66));
  EXPECT_EQ(d.k, 1);
  EXPECT_NEAR(d.speedup, 1.5 / (1 + 2 * (t66 / t65 - 1)), 1e-12);
  // the proposal's own time, relative to the step: 1.5 / (1 + 2 (0.0... + 0.3)) = 0.94: off
  EXPECT_EQ(spec_decide_batch(h, 0.5, 0.3, 1, 1, true, 65, 2).k, 0);
}

// SpecAuto: the probe schedule of one server sequence (8 plain steps after going off, then a probe;
// 16, 32, ... while probes lose), the draft length chosen per batch, and a batch that turns it off.
TEST(SpecCost, AutoProbeScheduleAndPerBatchDecision) {
  VerifyCostModel c;
  c.host_fixed = 100;
  c.host_expert = 10;
  c.n_expert = 8;
  c.top_k = 2;
  const SpecBatch one{1, 1, 0.0};
  {  // never right: a probe at k_max, then plain steps 8, 16, 32, 64, 128, 256, 256 between probes
    SpecAuto a;
    EXPECT_TRUE(a.probing());
    ASSERT_EQ(a.draft_len(c, one, 1, 4), 4);
    a.verified(c, one, 1, 4, 4, 0);
    EXPECT_FALSE(a.on());
    EXPECT_DOUBLE_EQ(a.accept_estimate(), 0.0);
    uint64_t plain = 0;
    for (int wait : {8, 16, 32, 64, 128, 256, 256}) {
      for (int i = 0; i < wait; ++i) ASSERT_EQ(a.draft_len(c, one, 1, 4), 0) << wait << " " << i;
      plain += static_cast<uint64_t>(wait);
      EXPECT_EQ(a.paused(), plain);
      ASSERT_TRUE(a.probing());
      ASSERT_EQ(a.draft_len(c, one, 1, 4), 4) << wait;  // the probe
      a.verified(c, one, 1, 4, 4, 0);
      EXPECT_FALSE(a.on());
    }
  }
  {  // always right: on from the first probe, drafting the best k (p = 1: k = 4, 5 / rel(4))
    SpecAuto a;
    ASSERT_EQ(a.draft_len(c, one, 1, 4), 4);
    a.verified(c, one, 1, 4, 4, 4);
    EXPECT_TRUE(a.on());
    EXPECT_DOUBLE_EQ(a.accept_estimate(), 1.0);
    for (int i = 0; i < 50; ++i) {
      ASSERT_EQ(a.draft_len(c, one, 1, 4), 4);
      a.verified(c, one, 1, 4, 4, 4);
    }
    EXPECT_EQ(a.paused(), 0u);
  }
  {  // hybrid, half right (p = 0.5 after a probe keeping 1 of 4: hits 1, tries 2): pays beside a
     // prompt chunk of 64 rows, not alone — drafting stops when the chunk is gone
    VerifyCostModel h = c;
    h.host_fixed = 0;
    h.dev_fixed = 100;
    const SpecBatch chunk{65, 2, 0.0};
    SpecAuto a;
    ASSERT_EQ(a.draft_len(h, chunk, 1, 1), 1);
    a.verified(h, chunk, 1, 1, 1, 1);  // kept: p = 1
    a.verified(h, chunk, 1, 1, 1, 0);  // rejected: p = 0.875 / 1.875 = 0.467
    EXPECT_NEAR(a.accept_estimate(), 0.875 / 1.875, 1e-12);
    // beside the chunk: 1.467 / (1 + 2 * 0.0000...) = 1.47: on
    EXPECT_TRUE(a.on());
    EXPECT_EQ(a.draft_len(h, chunk, 1, 1), 1);
    // alone: 1.467 / 1.4615 = 1.0035 >= 1: stays on (hysteresis); with a proposal costing 5 % of
    // the step: 1.467 / 1.5115 = 0.97: off, 8 plain steps (this one included), then a probe
    EXPECT_EQ(a.draft_len(h, one, 1, 1), 1);
    const SpecBatch alone_slow{1, 1, 0.05};
    EXPECT_EQ(a.draft_len(h, alone_slow, 1, 1), 0);
    EXPECT_FALSE(a.on());
    for (int i = 0; i < 7; ++i) EXPECT_EQ(a.draft_len(h, alone_slow, 1, 1), 0) << i;
    EXPECT_EQ(a.paused(), 8u);
    EXPECT_EQ(a.draft_len(h, alone_slow, 1, 1), 1);  // the probe
  }
}
