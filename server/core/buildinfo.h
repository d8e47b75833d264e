/* server/core/buildinfo.h: the version and commit engramd was built from.
 *
 * buildinfo.c is generated at build time (server/meson.build: vcs_tag over buildinfo.c.in),
 * so a rebuild after a commit carries the new commit.
 */
#ifndef ENGRAM_SERVER_BUILDINFO_H
#define ENGRAM_SERVER_BUILDINFO_H

/* The project's version (meson.build) and the git commit built (12 hex digits, "-dirty"
 * when the tree had changes; empty when the source was not a git checkout). */
extern const char buildinfo_version[];
extern const char buildinfo_commit[];

#endif
