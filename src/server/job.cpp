// The job layer (job.h): a job's output queue and its end.
#include "server/job.h"

namespace kimi::server {

std::string_view to_string(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::ToolCalls: return "tool_calls";
    case FinishReason::Length: return "length";
    case FinishReason::GrammarDeadEnd: return "grammar_dead_end";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Timeout: return "timeout";
    case FinishReason::Error: return "error";
  }
  return "error";
}

void JobOutput::append(JobOutput&& o) {
  if (o.prompt_done >= 0) prompt_done = o.prompt_done;
  text += o.text;
  reasoning += o.reasoning;
  content += o.content;
  for (auto& c : o.tool_calls) tool_calls.push_back(std::move(c));
  for (auto& t : o.tool_deltas) tool_deltas.push_back(std::move(t));
  for (auto& l : o.logprobs) logprobs.push_back(std::move(l));
}

Job::Job(std::vector<int32_t> prompt, GenParams params)
    : prompt_(std::move(prompt)), params_(std::move(params)), t_submit_(Clock::now()) {}

bool Job::wait(JobOutput& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return finished_ || !pending_.empty(); });
  out.append(std::move(pending_));
  pending_ = JobOutput{};
  return finished_;
}

Job::Result Job::result() const {
  std::lock_guard<std::mutex> lk(mu_);
  return result_;
}

bool Job::finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return finished_;
}

void Job::push(JobOutput&& o) {
  if (o.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.append(std::move(o));
  }
  cv_.notify_all();
}

void Job::finish(Result r) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    r.total_s = std::chrono::duration<double>(Clock::now() - t_submit_).count();
    if (result_.ttft_s >= 0) r.ttft_s = result_.ttft_s;
    result_ = std::move(r);
    finished_ = true;
  }
  cv_.notify_all();
}

void apply_chat_text(tok::ChatParser& parser, const std::string& text, JobOutput& out) {
  tok::ChatDelta d = parser.push(text);
  out.reasoning += d.reasoning;
  out.content += d.content;
  for (size_t i : d.tool_calls_completed) out.tool_calls.push_back(parser.message().tool_calls[i]);
  for (auto& t : d.tool_call_deltas) out.tool_deltas.push_back(std::move(t));
}

}  // namespace kimi::server
