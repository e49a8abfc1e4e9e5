// text.h — bytes a client chose (job names, symbol names) turned into text that is safe to store
// as a protobuf `string`, to print on an operator's terminal and to put in JSON. Base layer.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pos {

// True when `s` is well-formed UTF-8 (RFC 3629): no overlong forms, no surrogates (U+D800 to
// U+DFFF), nothing above U+10FFFF, no truncated sequence. Protobuf refuses to decode a `string`
// field that is not, so every such field an image holds must pass this.
bool is_utf8(std::string_view s);

// `s` with everything that could not be stored as text or could act on a terminal made visible:
// a byte that is not part of a well-formed UTF-8 sequence, a C0 control (U+0000 to U+001F) or DEL
// becomes `\xHH`; a C1 control (U+0080 to U+009F, which terminals obey like ESC) becomes `\u00HH`;
// every other well-formed character is kept as is. A backslash is not escaped, so the function is
// idempotent (printable(printable(x)) == printable(x)) and a sanitized name stays what it was when
// it is sanitized again (a restored client's name, a name shown by ps). The result is at most
// `max_bytes` bytes (at least 3): a longer one is cut between two characters or escapes and ends
// in "...". The result always satisfies is_utf8 and holds no control character.
std::string printable(std::string_view s, size_t max_bytes = std::string::npos);

// `text` (well-formed UTF-8, e.g. printable()'s result) cut or padded with spaces to `columns`
// characters, for a fixed-width table column: cut between characters, never inside one.
std::string fit_columns(std::string_view text, size_t columns);

// A JSON string literal, quotes included, holding printable(s): `"` and `\` escaped, and any
// control character as \u00XX. Always valid JSON (and valid UTF-8) whatever bytes `s` holds.
std::string json_string(std::string_view s);

}  // namespace pos
