#pragma once
// OpenAI's "stop": generation ends where any of the stop strings first appears in the generated
// text, and the text returned ends just before it. Text arrives in pieces and is streamed, so text
// that could still be the start of a stop string is held back until the next piece decides it.
#include <string>
#include <string_view>
#include <vector>

namespace dsv41 {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // The text that is now certain to be part of the reply.
  std::string push(std::string_view piece);
  // True once a stop string was found: the reply ends there, and push returns nothing more.
  bool stopped() const { return stopped_; }
  // The end of the reply: what was held back.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace dsv41
