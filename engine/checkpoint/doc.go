// Package checkpoint reads and writes gptui's training checkpoints in a
// format that does not depend on how the run that wrote them was
// parallelised.
//
// # Layout
//
// Checkpoints live in an output directory:
//
//	<output_dir>/
//	    latest                      "step_00000200\n": the newest complete checkpoint
//	    step_00000100/
//	        manifest.json
//	        rank_00000.safetensors
//	    step_00000200/
//	        manifest.json
//	        rank_00000.safetensors
//	        rank_00001.safetensors  (one file per writing rank)
//
// A checkpoint directory is named step_ followed by the step, zero-padded to
// eight digits (see [DirName]). Readers order checkpoints by the number, not
// by the name, so steps past 99,999,999 and unpadded names sort correctly.
// Names that begin with ".tmp-" are work in progress or debris of an
// interrupted save; readers ignore them and [Save] removes stale ones.
//
// manifest.json ([Manifest], sealed by its first line) records the step, the resolved configuration,
// the data loader and RNG states, the SHA-256 of every data file, and for
// every tensor its global shape and the blocks ([Slice]) of it that each file
// holds, in global coordinates. The data files are safetensors files
// (package safetensors): an 8-byte little-endian header length, a JSON
// header and the raw little-endian values. A loader running under any parallel
// layout asks [Checkpoint.Read] for exactly the block it needs and gets it
// assembled from whichever files hold its pieces.
//
// # Atomicity
//
// [Save] writes a checkpoint into a fresh .tmp-step_<N>-<random> directory,
// fsyncs every file and the directory, renames it to step_<N>, fsyncs the
// output directory, and then replaces latest atomically (temporary file,
// fsync, rename, fsync). Only then are checkpoints beyond keep_last removed,
// each first renamed to a .tmp- name so that a half-deleted directory is never
// mistaken for a checkpoint. A crash at any point leaves latest naming a
// complete checkpoint, and [Latest] verifies what it returns and falls back
// to the next newest checkpoint that loads if latest or its target is
// missing or damaged.
//
// # Copies
//
// A launcher that keeps checkpoints on several machines copies a
// checkpoint's files into a [TempCopyName] directory of the target's
// output directory and calls [Install], which verifies the copy and
// publishes it; a directory of the same step that does not load (a data
// file altered or missing, the manifest missing) is replaced, moved aside
// until the copy is in place. [Describe] summarises an output directory
// for the comparison ([Summary]): the newest checkpoint that loads, and of
// every directory its step, manifest hash and run ([Manifest.Run], which
// tells the checkpoints of one training run from another's).
//
// # Several writers
//
// A parallel save has every writer write its own data file at once: the
// writers agree on a token, each creates the save's temporary directory
// ([BeginSave], [SaveDir]) and writes its blocks into its file
// ([WriteShard]), which reports the blocks, the file's size and SHA-256
// ([ShardReport]); one of them, once it holds every report, writes the
// manifest and publishes the directory as [Save] does ([Commit]). No
// writer holds more than its own blocks, and a [Part] that is not a
// contiguous stretch of its writer's memory is copied out only as it is
// written ([Part.Fill]).
//
// # Versions and the seal
//
// The manifest carries [FormatVersion]. A reader refuses a checkpoint with a
// newer version and names both versions in the error. From version 2 the
// manifest is sealed: its first line holds the SHA-256 of the rest
// ([Seal]), so that a manifest altered by one byte (its step, a file's
// checksum) never loads; version 1 manifests, unsealed, still load.
package checkpoint
