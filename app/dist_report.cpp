// RankTrafficSum (dist_report.h).
#include "dist_report.h"

namespace kimi::app {

void RankTrafficSum::start(Context& ctx) const {
  if (ctx.n_ranks() > 1) ctx.rank_traffic(true);
}

void RankTrafficSum::stop(Context& ctx) {
  if (ctx.n_ranks() <= 1) return;
  const auto t = ctx.rank_traffic(true);
  if (sum.empty()) {
    sum = t;
    return;
  }
  for (size_t r = 0; r < t.size() && r < sum.size(); ++r) {
    CollectiveStats& c = sum[r].comm;
    c.bytes_sent += t[r].comm.bytes_sent;
    c.bytes_received += t[r].comm.bytes_received;
    c.calls += t[r].comm.calls;
    c.seconds += t[r].comm.seconds;
    sum[r].rss_bytes = t[r].rss_bytes;
    sum[r].model_rss_bytes = t[r].model_rss_bytes;
  }
}

void RankTrafficSum::print(FILE* f, double tokens) const {
  if (sum.empty() || tokens <= 0) return;
  std::fprintf(f, "| rank | weights read/token (MiB) | experts held (MiB) | sent/token (KiB) | recv/token (KiB) | "
                  "exchanges/token | in exchanges (ms/token) | RSS (MiB) | model RSS (MiB) |\n");
  std::fprintf(f, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const RankTraffic& t : sum)
    std::fprintf(f, "| %d | %.2f | %.2f | %.2f | %.2f | %.1f | %.3f | %.1f | %.1f |\n", t.rank,
                 double(t.dense_weight_bytes + t.expert_bytes_per_token) / 1048576.0,
                 double(t.expert_weight_bytes) / 1048576.0, double(t.comm.bytes_sent) / tokens / 1024.0,
                 double(t.comm.bytes_received) / tokens / 1024.0, double(t.comm.calls) / tokens,
                 1e3 * t.comm.seconds / tokens, double(t.rss_bytes) / 1048576.0, double(t.model_rss_bytes) / 1048576.0);
}

void RankTrafficSum::to_json(nlohmann::ordered_json& j, double tokens) const {
  if (sum.empty() || tokens <= 0) return;
  auto& a = j["ranks"] = nlohmann::ordered_json::array();
  for (const RankTraffic& t : sum) {
    nlohmann::ordered_json r;
    r["rank"] = t.rank;
    r["weight_bytes_per_token"] = double(t.dense_weight_bytes + t.expert_bytes_per_token);
    r["dense_weight_bytes_per_token"] = t.dense_weight_bytes;
    r["expert_weight_bytes_held"] = t.expert_weight_bytes;
    r["sent_bytes_per_token"] = double(t.comm.bytes_sent) / tokens;
    r["received_bytes_per_token"] = double(t.comm.bytes_received) / tokens;
    r["exchanges_per_token"] = double(t.comm.calls) / tokens;
    r["exchange_seconds_per_token"] = t.comm.seconds / tokens;
    r["rss_bytes"] = t.rss_bytes;
    r["model_rss_bytes"] = t.model_rss_bytes;
    a.push_back(r);
  }
}

}  // namespace kimi::app
