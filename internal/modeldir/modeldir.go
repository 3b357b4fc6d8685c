// Package modeldir reads Hugging Face model directories for the stages
// that take one (kiln-train's --model and --resume-from, kiln-sync's
// --checkpoint): a directory given by path, checked and named by content,
// or a checkpoints version materialized into a local cache and checked
// against its rows (docs/train-stage.md §6.3, §7).
package modeldir

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// trainerFiles are what the trainer adds to a checkpoint besides the
// weights (docs/train-stage.md §6): never copied from a base as "its
// non-weight files".
var trainerFiles = map[string]bool{"metrics.jsonl": true, "optimizer.pt": true, "trainer_state.json": true}

// IsTrainerFile reports whether a top-level checkpoint file name is one the
// trainer adds besides the weights (optimizer state, metrics, trainer
// state): not part of what an engine loads.
func IsTrainerFile(name string) bool { return trainerFiles[name] }

// IsWeightFile reports whether a checkpoint file name is weights, which a
// trained checkpoint replaces rather than copies from its base (as the
// reference's HF saver deletes them: spec-sync-train §3.6).
func IsWeightFile(name string) bool {
	for _, suf := range []string{".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".index.json", ".h5"} {
		if strings.HasSuffix(name, suf) {
			return true
		}
	}
	return false
}

// tokenizerFiles: a model directory needs tokenizer_config.json and one
// of the others for AutoTokenizer (and the policy server) to load it.
var tokenizerFiles = []string{"tokenizer.json", "tokenizer.model", "vocab.json"}

// Model is a base model (or resume checkpoint) directory on local disk.
type Model struct {
	Dir string // absolute
	// Ref is the checkpoints version it was materialized from; empty for
	// a directory given by path.
	Ref dataset.Ref
	// MaxContext is config.json's max_position_embeddings (0 if absent).
	MaxContext int
	// BaseFiles are the non-weight, non-trainer files at the top level of
	// Dir: what a trained checkpoint must carry over.
	BaseFiles []string
}

// Check checks a Hugging Face checkpoint directory: config.json
// (with max_position_embeddings, read for the context check), a
// tokenizer, and lists its non-weight files. Problems are bad input.
func Check(dir, flag string) (*Model, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	m := &Model{Dir: abs}
	cfg, err := os.ReadFile(filepath.Join(abs, "config.json"))
	if err != nil {
		return nil, stagecmd.BadInputf("%s %q: no config.json (%v): want a Hugging Face checkpoint directory", flag, dir, err)
	}
	var c struct {
		MaxPositionEmbeddings *int `json:"max_position_embeddings"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		return nil, stagecmd.BadInputf("%s %q: config.json: %v", flag, dir, err)
	}
	if c.MaxPositionEmbeddings != nil {
		m.MaxContext = *c.MaxPositionEmbeddings
	}
	has := func(f string) bool {
		fi, err := os.Stat(filepath.Join(abs, f))
		return err == nil && fi.Mode().IsRegular()
	}
	tok := false
	for _, f := range tokenizerFiles {
		tok = tok || has(f)
	}
	if !tok || !has("tokenizer_config.json") {
		return nil, stagecmd.BadInputf("%s %q has no tokenizer (want tokenizer_config.json and one of %s): the checkpoint kiln-train commits carries its base's tokenizer and chat template, so copy them in (python -m kiln_gpu.tiny writes both)",
			flag, dir, strings.Join(tokenizerFiles, ", "))
	}
	ents, err := os.ReadDir(abs)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if e.Type().IsRegular() && !IsWeightFile(e.Name()) && !trainerFiles[e.Name()] {
			m.BaseFiles = append(m.BaseFiles, e.Name())
		}
	}
	return m, nil
}

// Identity names a model directory by content for the version id:
// every regular file's relative path and size, and the sha256 of files up
// to hashLimit bytes; a larger file (weights) by its size and modification
// time, so a 100 GB checkpoint is not read twice per run
// (docs/train-stage.md §7).
func Identity(role, dir string) (dataset.External, error) {
	const hashLimit = 64 << 20
	h := sha256.New()
	var total int64
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return dataset.External{}, fmt.Errorf("%s %q: %w", role, dir, err)
	}
	sort.Strings(names)
	for _, p := range names {
		fi, err := os.Stat(p)
		if err != nil {
			return dataset.External{}, err
		}
		rel, _ := filepath.Rel(dir, p)
		total += fi.Size()
		fmt.Fprintf(h, "%s\x00%d\x00", filepath.ToSlash(rel), fi.Size())
		if fi.Size() > hashLimit {
			fmt.Fprintf(h, "mtime:%d\n", fi.ModTime().UnixNano())
			continue
		}
		sum, err := FileSHA256(p)
		if err != nil {
			return dataset.External{}, err
		}
		fmt.Fprintf(h, "%s\n", sum)
	}
	return dataset.External{Role: role, URI: dir, SHA256: hex.EncodeToString(h.Sum(nil)), Size: total}, nil
}

// FileSHA256 is the sha256 of the file at path, in lowercase hex.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %q: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// IsDir reports whether s names an existing directory.
func IsDir(s string) bool {
	fi, err := os.Stat(s)
	return err == nil && fi.IsDir()
}

// ReadCheckpointFiles reads a checkpoints version's file rows.
func ReadCheckpointFiles(ctx context.Context, v *dataset.Version) ([]records.CheckpointFile, error) {
	var out []records.CheckpointFile
	err := v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachCheckpointFile(data, func(f records.CheckpointFile) error {
			out = append(out, f)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoints %s: %w", v.Ref(), err)
	}
	return out, nil
}

// Materialize makes a checkpoints version a local directory under cache
// (<cache>/<name>@<version>): every file of its rows downloaded from the
// version's attachments and checked against its size and sha256, into a
// temporary directory renamed into place, so a directory that exists is
// complete. An existing one is reused.
func Materialize(ctx context.Context, st store.Store, ref dataset.Ref, cache, flag string) (string, error) {
	v, err := dataset.OpenKind(ctx, st, ref, records.CheckpointsKind(), flag)
	if errors.Is(err, dataset.ErrKindMismatch) {
		return "", fmt.Errorf("%w: pass a model directory or a checkpoints version", err)
	}
	if err != nil {
		return "", err
	}
	final := filepath.Join(cache, v.Dataset+"@"+v.Version)
	if IsDir(final) {
		return final, nil
	}
	files, err := ReadCheckpointFiles(ctx, v)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return "", fmt.Errorf("checkpoint cache %q: %w (set --cache-dir)", cache, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(final), ".partial-"+filepath.Base(v.Version)+"-")
	if err != nil {
		return "", fmt.Errorf("checkpoint cache %q: %w (set --cache-dir)", cache, err)
	}
	defer os.RemoveAll(tmp)
	for _, f := range files {
		if err := fetchFile(ctx, v, f, tmp); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		if IsDir(final) { // another run materialized it first
			return final, nil
		}
		return "", err
	}
	return final, nil
}

func fetchFile(ctx context.Context, v *dataset.Version, f records.CheckpointFile, dir string) error {
	rc, _, err := v.OpenAttachment(ctx, f.Name)
	if err != nil {
		return err
	}
	defer rc.Close()
	p := filepath.Join(dir, filepath.FromSlash(f.Name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	out, err := os.Create(p)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), rc)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("checkpoints %s: copying %q: %w", v.Ref(), f.Name, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); n != f.Size || sum != f.SHA256 {
		return fmt.Errorf("checkpoints %s: attachment %q has %d bytes sha256 %s, its row says %d bytes %s: %w",
			v.Ref(), f.Name, n, sum, f.Size, f.SHA256, dataset.ErrCorrupt)
	}
	return nil
}

// Resolve turns --model (or --resume-from) into a local checked
// directory: an existing directory is used in place; anything else is a
// checkpoints reference, pinned and materialized under cache.
func Resolve(ctx context.Context, st store.Store, arg, cache, flag string) (*Model, error) {
	if IsDir(arg) {
		return Check(arg, flag)
	}
	r, err := dataset.ParseRef(arg)
	if err != nil {
		if _, serr := os.Stat(arg); errors.Is(serr, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s %q: no such directory, and not a dataset reference (%v): %w", flag, arg, err, fs.ErrNotExist)
		}
		return nil, stagecmd.Usagef("%s %q is neither a directory nor a dataset reference: %v", flag, arg, err)
	}
	if !r.Pinned() {
		if r.Version, err = dataset.Resolve(ctx, st, r.Name); err != nil {
			if errors.Is(err, dataset.ErrNotFound) {
				return nil, fmt.Errorf("%s %q: no such directory, and %w", flag, arg, err)
			}
			return nil, err
		}
	}
	dir, err := Materialize(ctx, st, r, cache, flag)
	if err != nil {
		return nil, err
	}
	m, err := Check(dir, flag)
	if err != nil {
		return nil, err
	}
	m.Ref = r
	return m, nil
}
