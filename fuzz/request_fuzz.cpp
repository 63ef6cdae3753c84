// A request body as the server takes it: parsed as a chat request (messages and tools read and
// rendered with the official chat encoding) and as a completion request. Bad input is refused
// with an ApiError (an HTTP 4xx) or a dsv41::Error (the server's 400); nothing else may escape.
#include "engine/chat_format.h"
#include "fuzz_util.h"
#include "server/openai_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body = dsv41::fuzz::text(data, size);
  dsv41::ApiConfig api;
  api.models = {"dsv41-tiny"};
  api.vocab_size = 600;
  try {
    const dsv41::ChatRequest r = dsv41::parse_chat_request(body, api);
    dsv41::fuzz::refused_or_ok([&] {
      dsv41::ChatOptions options;
      options.tools = dsv41::chat_tools_from_json(r.tools);
      if (!r.reasoning_effort.is_null()) options.reasoning_effort = dsv41::reasoning_effort_from_json(r.reasoning_effort);
      (void)dsv41::render_chat(dsv41::chat_messages_from_json(r.messages), options);
    });
  } catch (const dsv41::ApiError&) {
  }
  try {
    (void)dsv41::parse_completion_request(body, api);
  } catch (const dsv41::ApiError&) {
  }
  return 0;
}
