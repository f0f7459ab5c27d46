// Reading corpora: documents streamed from .txt / .jsonl files, optionally xz-compressed.
//   .txt, .txt.xz      documents are separated by lines that are exactly "<|endoftext|>" (the line itself is
//                      dropped; a document keeps its other newlines)
//   .jsonl, .jsonl.xz  one document per line: a JSON object with a string field "text"
// Empty documents are skipped. Any other extension is read as .txt.
#ifndef KILN_DATA_TEXTREAD_H
#define KILN_DATA_TEXTREAD_H

#include <stddef.h>
#include <stdint.h>

struct kiln_error;
struct kiln_bytes;
struct kiln_textreader;

int kiln_textreader_open(struct kiln_textreader **out, const char *path, struct kiln_error *err);
// Replaces doc's contents with the next document. Sets *eof = 1 (and leaves doc empty) after the last one.
// Errors name the file and line (bad JSON, no "text" field, corrupt xz).
int kiln_textreader_next(struct kiln_textreader *r, struct kiln_bytes *doc, int *eof, struct kiln_error *err);
// Bytes of the file (compressed, for .xz) consumed so far, and the file's size: for progress and ETA.
uint64_t kiln_textreader_pos(const struct kiln_textreader *r);
uint64_t kiln_textreader_size(const struct kiln_textreader *r);
void kiln_textreader_close(struct kiln_textreader *r);

// JSON object lines. kiln_json_string_field replaces out with the exact bytes of the top-level string field
// key (an escaped \u0000 included, which cJSON would cut at); 0 found, 1 absent or not a string, -1
// malformed. It does not validate the rest of the line; kiln_jsonl_text does (with cJSON) and reads "text".
int kiln_json_string_field(const char *s, size_t n, const char *key, struct kiln_bytes *out);
int kiln_jsonl_text(const char *line, size_t n, struct kiln_bytes *text);

#endif
