#pragma once
// The chat page served at / (src/server/web/chat.html, embedded at build time by embed.cmake).
#include <string_view>

namespace dsv41 {

std::string_view chat_page();

}  // namespace dsv41
