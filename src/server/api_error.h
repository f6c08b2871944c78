// A request error of `kimi serve`: every layer of src/server throws it where a request is refused
// (a bad field, a grammar that cannot be built, a full queue); each API renders it in its own shape
// (OpenAI {"error":{"message","type","param","code"}}, Anthropic {"type":"error","error":{...}}).
#pragma once
#include <stdexcept>
#include <string>

namespace kimi::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type = "invalid_request_error", std::string param = "",
           std::string code = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type, param, code;
};

}  // namespace kimi::server
