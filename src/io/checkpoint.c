// Checkpoint storage: atomic save (temp dir + fsync + rename), verification by sha256, discovery of the
// newest good checkpoint, and pruning. The trainer decides what goes in; this file decides how it lands.
#include "io/checkpoint.h"

#include "io/fsutil.h"
#include "util/sha256.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// "step_" followed by at least 8 digits and nothing else; the step, or -1.
static int64_t parse_step_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0)
        return -1;
    const char *d = name + 5;
    size_t nd = strlen(d);
    if (nd < 8 || nd > 18)
        return -1;
    int64_t v = 0;
    for (size_t i = 0; i < nd; i++) {
        if (d[i] < '0' || d[i] > '9')
            return -1;
        v = v * 10 + (d[i] - '0');
    }
    return v;
}

static const char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') // tolerate a trailing slash
        n--;
    const char *s = path + n;
    while (s > path && s[-1] != '/')
        s--;
    return s;
}

// The step of a checkpoint directory path (tolerates a trailing slash), or -1 if it is not named step_N.
static int64_t dir_step(const char *path) {
    char name[256];
    const char *b = base_name(path);
    size_t n = strcspn(b, "/");
    if (n >= sizeof(name))
        return -1;
    memcpy(name, b, n);
    name[n] = '\0';
    return parse_step_name(name);
}

static int file_name_ok(const char *name) {
    return name && name[0] && name[0] != '.' && !strchr(name, '/') && strlen(name) < 200 &&
           strcmp(name, "state.json") != 0 && strcmp(name, "latest") != 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

// ---- listing ----------------------------------------------------------------------------------

struct step_entry {
    int64_t step;
    char *path;
};
static int step_entry_desc(const void *a, const void *b) {
    int64_t x = ((const struct step_entry *)a)->step, y = ((const struct step_entry *)b)->step;
    return x < y ? 1 : (x > y ? -1 : 0);
}

int kiln_ckpt_list(const char *run_dir, char ***paths, int64_t **steps, struct kiln_error *err) {
    *paths = NULL;
    if (steps)
        *steps = NULL;
    char dir[1024], p[1300];
    if (kiln_path_join(dir, sizeof(dir), run_dir, "ckpt", err))
        return -1;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        kiln_errorf(err, KILN_ERR_RUNTIME, "cannot list checkpoints (%s): %s", dir, strerror(errno));
        return -1;
    }
    int n = 0, cap = 16;
    struct step_entry *e = kiln_xmalloc(sizeof(*e) * (size_t)cap);
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s = parse_step_name(de->d_name);
        if (s < 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        if (!kiln_is_dir(p))
            continue;
        if (n == cap) {
            cap *= 2;
            struct step_entry *ne = realloc(e, sizeof(*e) * (size_t)cap);
            KILN_ASSERT(ne != NULL);
            e = ne;
        }
        e[n++] = (struct step_entry){s, kiln_xstrdup(p)};
    }
    closedir(d);
    qsort(e, (size_t)n, sizeof(*e), step_entry_desc);
    *paths = kiln_xmalloc(sizeof(char *) * (size_t)(n ? n : 1));
    if (steps)
        *steps = kiln_xmalloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        (*paths)[i] = e[i].path;
        if (steps)
            (*steps)[i] = e[i].step;
    }
    free(e);
    return n;
}

static void free_list(char **paths, int64_t *steps, int n) {
    for (int i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
    free(steps);
}

// ---- verify and load --------------------------------------------------------------------------

// Verifies ckpt_dir; when out is non-NULL also leaves state, model and optim open in it. Of the listed files
// it hashes those whose index (in state.json's order) is share_rank modulo share_size: all with 0 of 1.
static int ckpt_check(const char *ckpt_dir, struct kiln_ckpt *out, int share_rank, int share_size,
                      struct kiln_error *err) {
    char p[1200];
    const char *bad = "corrupt checkpoint";
    if (kiln_path_join(p, sizeof(p), ckpt_dir, "state.json", err))
        return err ? err->code : KILN_ERR_USAGE;
    char *text;
    size_t len;
    struct stat st;
    // a path that is no checkpoint at all says so, not that a checkpoint is torn
    if (stat(ckpt_dir, &st) != 0)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "no checkpoint (%s): %s; check the path: a checkpoint is a directory RUN/ckpt/step_N", ckpt_dir,
            errno == ENOENT ? "the path does not exist" : strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "not a checkpoint (%s): a file, where a checkpoint is a directory holding state.json; "
            "give its directory, RUN/ckpt/step_N",
            ckpt_dir);
    if (stat(p, &st) != 0 && dir_step(ckpt_dir) < 0) {
        char sub[1200];
        int run_dir = !kiln_path_join(sub, sizeof(sub), ckpt_dir, "ckpt", NULL) && kiln_is_dir(sub);
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "not a checkpoint (%s): %s; give one of %s checkpoints, a directory RUN/ckpt/step_N", ckpt_dir,
            run_dir ? "a run directory, not one of its checkpoints" : "it holds no state.json",
            run_dir ? "its" : "a run's");
    }
    if (stat(p, &st) != 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "%s (%s): %s; the checkpoint was not written completely",
                           bad, p, strerror(errno));
    if (kiln_read_file(p, &text, &len, err))
        return err ? err->code : KILN_ERR_RUNTIME;
    cJSON *state = cJSON_ParseWithLength(text, len);
    free(text);
    int rc = 0;
    int64_t want_step = dir_step(ckpt_dir);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(state, "format");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(state, "step");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(state, "files");
    if (!cJSON_IsObject(state)) {
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s (%s): not a JSON object", bad, p);
    } else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, KILN_CKPT_FORMAT) != 0) {
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s (%s): \"format\" is %s, expected \"%s\"", bad, p,
                         cJSON_IsString(fmt) ? fmt->valuestring : "missing", KILN_CKPT_FORMAT);
    } else if (!cJSON_IsNumber(step) || step->valuedouble < 0 ||
               (want_step >= 0 && step->valuedouble != (double)want_step)) {
        rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                         "%s (%s): \"step\" is missing or does not match the directory name", bad, p);
    } else if (!cJSON_IsObject(files)) {
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s (%s): \"files\" is missing", bad, p);
    } else if (out && !cJSON_GetObjectItemCaseSensitive(files, "model.safetensors")) {
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s (%s): lists no model.safetensors", bad, p);
    }
    int index = 0;
    for (const cJSON *f = files ? files->child : NULL; f && !rc; f = f->next, index++) {
        char fp[1200], hex[65];
        if (!file_name_ok(f->string) || !cJSON_IsString(f) || strlen(f->valuestring) != 64) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s (%s): bad entry \"%s\" in \"files\"", bad, p,
                             f->string);
            break;
        }
        if ((rc = kiln_path_join(fp, sizeof(fp), ckpt_dir, f->string, err)))
            break;
        if (stat(fp, &st) != 0) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s (%s): %s; the file is listed in state.json", bad, fp,
                             strerror(errno));
            break;
        }
        if (index % share_size != share_rank) {
            // another rank hashes it
        } else if ((rc = kiln_sha256_file(fp, hex, err))) {
            break;
        } else if (strcmp(hex, f->valuestring) != 0) {
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "%s (%s): sha256 is %.16s..., state.json says %.16s...; the file was changed or "
                             "truncated after it was written",
                             bad, fp, hex, f->valuestring);
            break;
        }
        if (!ends_with(f->string, ".safetensors"))
            continue;
        struct kiln_safetensors *st_file;
        if ((rc = kiln_safetensors_open(&st_file, fp, err)))
            break;
        if (out && strcmp(f->string, "model.safetensors") == 0)
            out->model = st_file;
        else if (out && strcmp(f->string, "optim.safetensors") == 0)
            out->optim = st_file;
        else
            kiln_safetensors_close(st_file);
    }
    if (!rc && out) {
        out->state = state;
        snprintf(out->path, sizeof(out->path), "%s", ckpt_dir);
    } else {
        cJSON_Delete(state);
    }
    return rc;
}

int kiln_ckpt_verify(const char *ckpt_dir, struct kiln_error *err) {
    return ckpt_check(ckpt_dir, NULL, 0, 1, err);
}

void kiln_ckpt_close(struct kiln_ckpt *c) {
    cJSON_Delete(c->state);
    kiln_safetensors_close(c->model);
    kiln_safetensors_close(c->optim);
    c->state = NULL;
    c->model = c->optim = NULL;
}

int kiln_ckpt_load_share(const char *ckpt_dir, struct kiln_ckpt *out, int share_rank, int share_size,
                         struct kiln_error *err) {
    KILN_ASSERT(share_size >= 1 && share_rank >= 0 && share_rank < share_size);
    memset(out, 0, sizeof(*out));
    if (strlen(ckpt_dir) >= sizeof(out->path))
        return kiln_errorf(err, KILN_ERR_USAGE, "checkpoint path too long (%s)", ckpt_dir);
    int rc = ckpt_check(ckpt_dir, out, share_rank, share_size, err);
    if (rc)
        kiln_ckpt_close(out);
    return rc;
}

int kiln_ckpt_load(const char *ckpt_dir, struct kiln_ckpt *out, struct kiln_error *err) {
    return kiln_ckpt_load_share(ckpt_dir, out, 0, 1, err);
}

// The loop shared by find_latest and load_latest: newest first, skipping (and reporting) corrupt ones.
static int ckpt_newest_good(const char *run_dir, char *path_out, size_t cap, struct kiln_ckpt *out,
                            void (*on_skip)(void *user, const char *path, const char *why), void *user,
                            struct kiln_error *err) {
    char **paths;
    int64_t *steps;
    int n = kiln_ckpt_list(run_dir, &paths, &steps, err);
    if (n < 0)
        return err ? err->code : KILN_ERR_RUNTIME;
    if (n == 0) {
        free_list(paths, steps, n);
        return KILN_CKPT_NONE;
    }
    struct kiln_error why, first_why = {0};
    int rc = -2; // not decided yet
    for (int i = 0; i < n && rc == -2; i++) {
        int bad = out ? kiln_ckpt_load(paths[i], out, &why) : kiln_ckpt_verify(paths[i], &why);
        if (!bad) {
            if (path_out && strlen(paths[i]) >= cap) {
                if (out)
                    kiln_ckpt_close(out);
                rc = kiln_errorf(err, KILN_ERR_USAGE, "checkpoint path too long (%s): more than %zu bytes",
                                 paths[i], cap - 1);
            } else {
                if (path_out)
                    snprintf(path_out, cap, "%s", paths[i]);
                rc = 0;
            }
            break;
        }
        if (i == 0)
            first_why = why;
        if (on_skip)
            on_skip(user, paths[i], why.msg);
    }
    if (rc == -2)
        rc = kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "no usable checkpoint (%s/ckpt): all %d checkpoints are corrupt, the newest because: %s; "
            "repair or move them away, or start without resuming",
            run_dir, n, first_why.msg);
    free_list(paths, steps, n);
    return rc;
}

int kiln_ckpt_find_latest(const char *run_dir, char *path_out, size_t cap,
                          void (*on_skip)(void *user, const char *path, const char *why), void *user,
                          struct kiln_error *err) {
    return ckpt_newest_good(run_dir, path_out, cap, NULL, on_skip, user, err);
}

int kiln_ckpt_load_latest(const char *run_dir, struct kiln_ckpt *out,
                          void (*on_skip)(void *user, const char *path, const char *why), void *user,
                          struct kiln_error *err) {
    memset(out, 0, sizeof(*out));
    return ckpt_newest_good(run_dir, NULL, 0, out, on_skip, user, err);
}

int kiln_ckpt_state_count(const cJSON *obj, const char *field, uint64_t *out, struct kiln_error *err) {
    const char *dot = strrchr(field, '.');
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, dot ? dot + 1 : field);
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(d >= 0)) // also NaN
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "state.json field '%s' missing or not a count: not a kiln training checkpoint",
                           field);
    if (d > KILN_CKPT_COUNT_MAX)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "state.json field '%s' is %.16g: more than 2^53 = %.0f, the largest count kept exactly; "
            "the checkpoint is damaged",
            field, d, KILN_CKPT_COUNT_MAX);
    if (d != (double)(uint64_t)d)
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "state.json field '%s' is %.16g: not a whole number; the checkpoint is damaged",
                           field, d);
    *out = (uint64_t)d;
    return 0;
}

// ---- save -------------------------------------------------------------------------------------

// Removes what killed writers left in RUN/ckpt: .tmp-* directories and latest.tmp-* files.
static int remove_stale(const char *ckpt_dir, struct kiln_error *err) {
    DIR *d = opendir(ckpt_dir);
    if (!d)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot list checkpoints (%s): %s", ckpt_dir,
                           strerror(errno));
    struct dirent *de;
    int rc = 0;
    while (!rc && (de = readdir(d))) {
        if (strncmp(de->d_name, ".tmp-", 5) != 0 && strncmp(de->d_name, "latest.tmp-", 11) != 0)
            continue;
        char p[1300];
        snprintf(p, sizeof(p), "%s/%s", ckpt_dir, de->d_name);
        rc = kiln_remove_tree(p, err);
    }
    closedir(d);
    return rc;
}

// Moves a directory out of the way under a .tmp- name (so a crash mid-removal leaves nothing that looks
// like a checkpoint), then removes it.
static int remove_dir_safely(const char *ckpt_dir, const char *path, struct kiln_error *err) {
    char aside[1200];
    snprintf(aside, sizeof(aside), "%s/.tmp-del-%ld-%016llx", ckpt_dir, (long)getpid(),
             (unsigned long long)kiln_nonce());
    if (rename(path, aside) != 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot remove checkpoint (%s): %s", path, strerror(errno));
    if (kiln_fsync_dir(ckpt_dir, err))
        return err ? err->code : KILN_ERR_RUNTIME;
    return kiln_remove_tree(aside, err);
}

// Puts the complete directory tmp in place as final. An existing final is swapped out atomically
// (renameat2 RENAME_EXCHANGE) where the file system can; otherwise it is moved aside first, which leaves a
// short window where step_N is absent (older checkpoints still exist).
static int install_dir(const char *ckpt_dir, const char *tmp, const char *final, struct kiln_error *err) {
    if (rename(tmp, final) == 0)
        return 0;
    if (errno != EEXIST && errno != ENOTEMPTY)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot rename checkpoint (%s -> %s): %s", tmp, final,
                           strerror(errno));
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0)
        return kiln_remove_tree(tmp, err); // tmp now holds the old checkpoint
#endif
    char aside[1200];
    snprintf(aside, sizeof(aside), "%s/.tmp-old-%ld-%016llx", ckpt_dir, (long)getpid(),
             (unsigned long long)kiln_nonce());
    if (rename(final, aside) != 0 || rename(tmp, final) != 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot replace checkpoint (%s): %s", final,
                           strerror(errno));
    return kiln_remove_tree(aside, err);
}

static int prune(const char *run_dir, const char *ckpt_dir, int64_t saved_step,
                 const struct kiln_ckpt_policy *policy, struct kiln_error *err) {
    if (!policy || policy->keep_last <= 0)
        return 0;
    char **paths;
    int64_t *steps;
    int n = kiln_ckpt_list(run_dir, &paths, &steps, err);
    if (n < 0)
        return err ? err->code : KILN_ERR_RUNTIME;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int keep = i == 0 || i < policy->keep_last || steps[i] == saved_step ||
                   (policy->keep_every > 0 && steps[i] % policy->keep_every == 0);
        if (!keep)
            rc = remove_dir_safely(ckpt_dir, paths[i], err);
    }
    free_list(paths, steps, n);
    return rc;
}

// Rank 0 of the group prepares the temporary directory; returns 0 or an error, and its name in tmp.
static int save_prepare(const char *run_dir, const char *ckpt_dir, const char *name, char *tmp, size_t cap,
                        struct kiln_error *err) {
    int rc = kiln_mkdir_p(ckpt_dir, err);
    if (!rc) // makes a newly created ckpt/ itself durable
        rc = kiln_fsync_dir(run_dir, err);
    if (!rc)
        rc = remove_stale(ckpt_dir, err);
    if (rc)
        return rc;
    snprintf(tmp, cap, "%s/.tmp-%s-%ld-%016llx", ckpt_dir, name, (long)getpid(),
             (unsigned long long)kiln_nonce());
    if (mkdir(tmp, 0777) != 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "cannot create directory (%s): %s", tmp, strerror(errno));
    return 0;
}

// Rank 0 of the group: state.json with every part's hash, then the rename that makes the checkpoint exist;
// the pruning by the policy too unless deferred (kiln_ckpt_prune later).
static int save_install(const char *run_dir, const char *ckpt_dir, const char *name, const char *tmp,
                        int64_t step, const cJSON *state_json, cJSON *hashes,
                        const struct kiln_ckpt_policy *policy, int defer_prune, struct kiln_error *err) {
    char final[1200], p[1400];
    snprintf(final, sizeof(final), "%s/%s", ckpt_dir, name);
    cJSON *state = state_json ? cJSON_Duplicate(state_json, 1) : cJSON_CreateObject();
    KILN_ASSERT(state);
    cJSON_DeleteItemFromObjectCaseSensitive(state, "format");
    cJSON_DeleteItemFromObjectCaseSensitive(state, "files");
    cJSON_DeleteItemFromObjectCaseSensitive(state, "step");
    cJSON_AddStringToObject(state, "format", KILN_CKPT_FORMAT);
    cJSON_AddNumberToObject(state, "step", (double)step);
    cJSON_AddItemToObject(state, "files", hashes);
    char *text = cJSON_Print(state);
    KILN_ASSERT(text != NULL);
    snprintf(p, sizeof(p), "%s/state.json", tmp);
    size_t len = strlen(text);
    text[len] = '\n'; // replaces the NUL; we write len + 1 bytes
    int rc = kiln_write_file_atomic(p, text, len + 1, err);
    free(text);
    cJSON_Delete(state);
    if (!rc)
        rc = kiln_fsync_dir(tmp, err);
    if (!rc)
        rc = install_dir(ckpt_dir, tmp, final, err);
    if (!rc)
        rc = kiln_fsync_dir(ckpt_dir, err);
    if (rc)
        return rc;
    char latest_text[80];
    int n = snprintf(latest_text, sizeof(latest_text), "%s\n", name);
    snprintf(p, sizeof(p), "%s/latest", ckpt_dir);
    rc = kiln_write_file_atomic(p, latest_text, (size_t)n, err);
    if (!rc && !defer_prune)
        rc = prune(run_dir, ckpt_dir, step, policy, err);
    return rc;
}

int kiln_ckpt_prune(const char *run_dir, int64_t saved_step, const struct kiln_ckpt_policy *policy,
                    struct kiln_error *err) {
    char ckpt_dir[1024];
    int rc = kiln_path_join(ckpt_dir, sizeof(ckpt_dir), run_dir, "ckpt", err);
    return rc ? rc : prune(run_dir, ckpt_dir, saved_step, policy, err);
}

static int check_files(const char *run_dir, int64_t step, const struct kiln_ckpt_file *files, int n_files,
                       const cJSON *state_json, struct kiln_error *err) {
    if (step < 0)
        return kiln_errorf(err, KILN_ERR_USAGE, "cannot save checkpoint (%s): negative step %lld", run_dir,
                           (long long)step);
    if (state_json && !cJSON_IsObject(state_json))
        return kiln_errorf(err, KILN_ERR_USAGE, "cannot save checkpoint (%s): state is not a JSON object",
                           run_dir);
    for (int i = 0; i < n_files; i++) {
        if (!file_name_ok(files[i].name))
            return kiln_errorf(err, KILN_ERR_USAGE, "cannot save checkpoint (%s): bad file name \"%s\"",
                               run_dir, files[i].name ? files[i].name : "(null)");
        for (int j = 0; j < i; j++)
            if (strcmp(files[i].name, files[j].name) == 0)
                return kiln_errorf(err, KILN_ERR_USAGE,
                                   "cannot save checkpoint (%s): file \"%s\" given twice", run_dir,
                                   files[i].name);
    }
    const cJSON *given_step = state_json ? cJSON_GetObjectItemCaseSensitive(state_json, "step") : NULL;
    if (given_step && (!cJSON_IsNumber(given_step) || given_step->valuedouble != (double)step))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "cannot save checkpoint (%s): state \"step\" differs from %lld", run_dir,
                           (long long)step);
    return 0;
}

int kiln_ckpt_group_begin(struct kiln_ckpt_part *part, const char *run_dir, int64_t step,
                          const struct kiln_ckpt_file *files, int n_files, const cJSON *state_json,
                          const struct kiln_ckpt_group *grp, struct kiln_error *err) {
    int rank = grp ? grp->rank : 0, size = grp ? grp->size : 1;
    memset(part, 0, sizeof(*part));
    part->step = step;
    int rc = check_files(run_dir, step, files, n_files, state_json, err);
    if (!rc)
        rc = kiln_path_join(part->ckpt_dir, sizeof(part->ckpt_dir), run_dir, "ckpt", err);
    snprintf(part->name, sizeof(part->name), "step_%08lld", (long long)step);
    // rank 0 makes the temporary directory, and every rank learns its name (or that it failed)
    if (!rc && rank == 0)
        rc = save_prepare(run_dir, part->ckpt_dir, part->name, part->tmp, sizeof(part->tmp), err);
    if (size > 1) {
        rc = grp->agree(grp->user, rc);
        if (rc) // the failing rank's own message, or a line saying another rank failed
            return err && err->code
                       ? rc
                       : kiln_errorf(err, KILN_ERR_RUNTIME,
                                     "checkpoint step %lld (%s): another rank could not prepare it",
                                     (long long)step, run_dir);
        grp->broadcast(grp->user, part->tmp, sizeof(part->tmp));
    }
    return rc;
}

// every rank writes its own files (durably: the writer fsyncs each), no collectives
int kiln_ckpt_group_write(struct kiln_ckpt_part *part, const struct kiln_ckpt_file *files, int n_files,
                          struct kiln_error *err) {
    size_t used = 0;
    int rc = 0;
    part->mine[0] = 0;
    for (int i = 0; i < n_files && !rc; i++) {
        char hex[65], p[1400];
        snprintf(p, sizeof(p), "%s/%s", part->tmp, files[i].name);
        rc = kiln_safetensors_write_sha(p, files[i].tensors, files[i].n, NULL, hex, err);
        if (!rc) {
            int k = snprintf(part->mine + used, sizeof(part->mine) - used, "%s %s\n", files[i].name, hex);
            KILN_ASSERT(k > 0 && (size_t)k < sizeof(part->mine) - used);
            used += (size_t)k;
        }
    }
    return part->write_rc = rc;
}

int kiln_ckpt_group_finish(struct kiln_ckpt_part *part, const char *run_dir, const cJSON *state_json,
                           const struct kiln_ckpt_policy *policy, const struct kiln_ckpt_group *grp,
                           struct kiln_error *err) {
    int rank = grp ? grp->rank : 0, size = grp ? grp->size : 1;
    int64_t step = part->step;
    int rc = part->write_rc;
    char *all = part->mine;
    if (size > 1) {
        int any = grp->agree(grp->user, rc);
        if (any && !rc)
            rc = kiln_errorf(err, KILN_ERR_RUNTIME,
                             "checkpoint step %lld (%s): another rank could not write its part; the previous "
                             "checkpoint stays the newest",
                             (long long)step, run_dir);
        if (!rc) {
            all = kiln_xcalloc((size_t)size, KILN_CKPT_RECORD);
            grp->all_gather(grp->user, part->mine, all, KILN_CKPT_RECORD);
        }
    }
    // rank 0 hashes into state.json and installs the directory: only now does the checkpoint exist
    if (!rc && rank == 0) {
        cJSON *hashes = cJSON_CreateObject();
        for (int r = 0; r < size; r++) {
            char *rec = all + (size_t)r * KILN_CKPT_RECORD;
            rec[KILN_CKPT_RECORD - 1] = 0;
            for (char *save = NULL, *line = strtok_r(rec, "\n", &save); line;
                 line = strtok_r(NULL, "\n", &save)) {
                char *sp = strchr(line, ' ');
                KILN_ASSERT(sp);
                *sp = 0;
                cJSON_AddItemToObject(hashes, line, cJSON_CreateString(sp + 1));
            }
        }
        rc = save_install(run_dir, part->ckpt_dir, part->name, part->tmp, step, state_json, hashes, policy,
                          part->defer_prune, err);
    }
    if (all != part->mine)
        free(all);
    if (rc && rank == 0 && part->tmp[0])
        kiln_remove_tree(part->tmp, NULL);
    if (size > 1) { // everyone returns rank 0's verdict
        int r0 = grp->agree(grp->user, rc);
        if (r0 && !rc)
            rc =
                kiln_errorf(err, KILN_ERR_RUNTIME,
                            "checkpoint step %lld (%s): rank 0 could not install it; the previous checkpoint "
                            "stays the newest",
                            (long long)step, run_dir);
    }
    return rc;
}

int kiln_ckpt_save_group(const char *run_dir, int64_t step, const struct kiln_ckpt_file *files, int n_files,
                         const cJSON *state_json, const struct kiln_ckpt_policy *policy,
                         const struct kiln_ckpt_group *grp, struct kiln_error *err) {
    struct kiln_ckpt_part *part = kiln_xmalloc(sizeof(*part));
    int rc = kiln_ckpt_group_begin(part, run_dir, step, files, n_files, state_json, grp, err);
    if (!rc) {
        kiln_ckpt_group_write(part, files, n_files, err);
        rc = kiln_ckpt_group_finish(part, run_dir, state_json, policy, grp, err);
    }
    free(part);
    return rc;
}

int kiln_ckpt_save(const char *run_dir, int64_t step, const struct kiln_ckpt_file *files, int n_files,
                   const cJSON *state_json, const struct kiln_ckpt_policy *policy, struct kiln_error *err) {
    return kiln_ckpt_save_group(run_dir, step, files, n_files, state_json, policy, NULL, err);
}
