// TensorBoard event files: TFRecord framing of protobuf Events (the schema kiln writes is
// tensorboard_event.proto). Each record is
//   uint64 length | uint32 masked crc32c(length) | data | uint32 masked crc32c(data)   (little-endian)
// and the first record of a file is an Event with file_version "brain.Event:2". One writer makes one file,
// DIR/events.out.tfevents.<unix seconds>.<host>.<pid>.kiln; TensorBoard merges every file in DIR.
#ifndef KILN_IO_TENSORBOARD_H
#define KILN_IO_TENSORBOARD_H

#include <stdint.h>

#include "util/error.h"

struct kiln_tb;

struct kiln_tb_scalar {
    const char *tag; // "train/loss"
    double value;    // stored as float, as TensorBoard's scalars are
};

// 1 if this build writes event files (it found protobuf-c), else 0 and kiln_tb_open says what is missing.
int kiln_tb_available(void);

// Creates DIR if needed and a new event file in it. `what` names the option for messages ("--tensorboard").
int kiln_tb_open(const char *dir, const char *what, struct kiln_tb **out, struct kiln_error *err);
// A (re)start at step: TensorBoard drops the events of steps >= step that earlier files in the directory hold
// (the steps a killed run logged past the checkpoint it is resumed from).
int kiln_tb_write_start(struct kiln_tb *tb, int64_t step, struct kiln_error *err);
// One Event holding n scalars at step, flushed to the file.
int kiln_tb_write_scalars(struct kiln_tb *tb, int64_t step, const struct kiln_tb_scalar *v, int n,
                          struct kiln_error *err);
// One Event holding text (Markdown, shown by TensorBoard's Text tab) under tag at step, flushed.
int kiln_tb_write_text(struct kiln_tb *tb, int64_t step, const char *tag, const char *text,
                       struct kiln_error *err);
const char *kiln_tb_path(const struct kiln_tb *tb); // the event file's path
void kiln_tb_close(struct kiln_tb *tb);             // NULL is fine

#endif
