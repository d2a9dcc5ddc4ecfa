/* bundle.h - .fasa bundles: one reproducible tar file holding a converted model directory, with a
 * manifest of member sizes and checksums.
 *
 *   const char *names[] = { "config.json", "tokenizer.json", "profile.json", "model.safetensors" };
 *   bundle_write("m.fasa", "m.dir", names, 4, 0, err);   // temp file + rename; 1: zstd filter
 *   bundle_open("m.fasa", "outdir", err);                // verify every member and extract
 *   bundle_open("m.fasa", NULL, err);                    // verify only
 *   char dir[4096];
 *   bundle_extract_temp("m.fasa", dir, sizeof dir, err); // into a fresh mkdtemp directory
 *   bundle_remove_dir(dir);
 *
 * Byte layout: a POSIX tar written by libarchive as "pax restricted" (plain ustar headers unless
 * a member needs more), optionally through the zstd filter. Members are flat names in a fixed
 * order: MANIFEST.json first, then the files in the order the writer was given them. Every
 * header has mtime 0, uid and gid 0, no user or group name and mode 0644, so the same files give
 * the same bytes. MANIFEST.json (compact JSON, keys in this order):
 *   {"format":"fasa-bundle","version":1,"checksum":"xxh64",
 *    "members":[{"name":"config.json","size":812,"xxh64":"0123456789abcdef"},...]}
 * The manifest lists every other member exactly once; readers reject an archive whose first member
 * is not the manifest, a member that is missing, unlisted, repeated, not a regular file, or has a
 * name with a '/', a leading '.' or a byte outside [A-Za-z0-9._-], and any size or checksum that
 * differs from the manifest. Such bundles fail with one line naming the bundle and the problem.
 * Being a plain tar, a bundle also unpacks with `tar xf` (`tar --zstd -xf` when compressed).
 */
#ifndef FASA_BUNDLE_H
#define FASA_BUNDLE_H

#include <stddef.h>

#include "base.h"

#define BUNDLE_MANIFEST "MANIFEST.json"
#define BUNDLE_MAX_MEMBERS 64

/* Writes path from the files dir/names[i] (i < n). The bundle is built in a temporary file next
 * to path and renamed into place, so path holds the old file or the whole new one. */
int bundle_write(const char *path, const char *dir, const char *const *names, int n, int zstd, char *err);

/* Reads the bundle at path, checking the manifest and every member's size and checksum. With
 * outdir (an existing directory), extracts the members into it (O_EXCL: nothing is overwritten);
 * on failure the files it extracted are removed again. With outdir NULL, only verifies. */
int bundle_open(const char *path, const char *outdir, char *err);
/* The same for a bundle held in memory (len bytes); name is used in messages only. */
int bundle_open_mem(const void *data, size_t len, const char *name, const char *outdir, char *err);

/* bundle_open into a new directory made by mkdtemp under $TMPDIR (else /tmp); its path goes to
 * dir. On failure nothing is left behind. */
int bundle_extract_temp(const char *path, char *dir, size_t cap, char *err);

/* Removes the regular files directly inside dir, then dir itself (a flat directory such as
 * bundle_extract_temp or convert makes). Best effort: errors are ignored. */
void bundle_remove_dir(const char *dir);

#endif
