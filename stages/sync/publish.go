package sync

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	gosync "sync"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/modeldir"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// codeVersion is the publish code version (dataset.Identity): bump it when
// the rows or attachments committed for the same checkpoint change.
const codeVersion = "1"

// DefaultFullEvery is --full-every's default (docs/sync.md §1.1).
const DefaultFullEvery = 16

// DefaultPackLimit bounds a pack attachment (docs/sync.md §1.1); a single
// frame larger than it gets a pack of its own.
const DefaultPackLimit = 256 << 20

// Hook points of a publish (stagecmd.Env.Hook, besides the dataset
// writer's): the crash tests stop a publish at each. They may be called
// from several goroutines.
const (
	HookPublishClaimed    = "sync-publish-claimed"     // the weights number is claimed, nothing uploaded
	HookPublishFileStored = "sync-publish-file-stored" // one file of a full version is stored
	HookPublishPackStored = "sync-publish-pack-stored" // one pack of a delta is stored
)

// PublishOptions describe one publish (docs/sync.md §1).
type PublishOptions struct {
	// Checkpoint is a checkpoints reference (name or name@version) or a
	// model directory.
	Checkpoint string
	// CacheDir is where a checkpoints version is materialized (default
	// ~/.cache/kiln/checkpoints, as kiln-train's --cache-dir).
	CacheDir string
	// Full forces a full version.
	Full bool
	// FullEvery: a version is full when FullEvery-1 deltas follow the
	// last full one, so every FullEvery-th version is full; 0 never.
	// Callers pass DefaultFullEvery unless told otherwise.
	FullEvery int
	// BaseDir is a pull directory (docs/sync.md §2) that may hold a
	// verified copy of the base, for xor or overwrite payloads.
	BaseDir string
	// Encoding is the delta encoding when the base's bytes are in BaseDir:
	// "" or xor, or overwrite. Without them it is replace.
	Encoding string
	// Workers bounds the changed tensors compressed at once by a delta
	// (also bounded by bytes, deltaEncodeBudget) and the files uploaded
	// at once by a full version (at most 8) (default GOMAXPROCS).
	Workers int
	// PackLimit bounds a pack attachment (default DefaultPackLimit).
	PackLimit int64
}

// Publish commits the weights version of o.Checkpoint as out.Name
// (docs/sync.md §1) through stagecmd.Write: the version id names the
// checkpoint only, so a rerun finds its version and publishes nothing
// (but moves latest, forward only). Bad checkpoints are exit 5, before
// any number is claimed.
func Publish(ctx context.Context, env *stagecmd.Env, st store.Store, out stagecmd.Output, o PublishOptions) (dataset.Result, error) {
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.PackLimit <= 0 {
		o.PackLimit = DefaultPackLimit
	}
	if o.FullEvery < 0 {
		return dataset.Result{}, stagecmd.Usagef("--full-every %d: want 0 (never) or more", o.FullEvery)
	}
	switch o.Encoding {
	case "", records.EncXOR, records.EncOverwrite:
	default:
		return dataset.Result{}, stagecmd.Usagef("--encoding %q: want %s or %s (replace is used when no base is at hand)", o.Encoding, records.EncXOR, records.EncOverwrite)
	}
	if err := dataset.CheckName(out.Name); err != nil {
		return dataset.Result{}, stagecmd.UsageError{Err: err}
	}
	src, id, err := resolveCheckpoint(ctx, st, o.Checkpoint)
	if err != nil {
		return dataset.Result{}, err
	}
	out.Kind = records.WeightsKind()
	out.Identity = id
	version, err := id.Version()
	if err != nil {
		return dataset.Result{}, err
	}
	p := &publisher{env: env, st: st, o: o, out: out, src: src, ref: dataset.Ref{Name: out.Name, Version: version}}
	out.LatestIf = p.forwardOnly
	return stagecmd.Write(ctx, st, out, env.Stdout, env.Log, p.produce)
}

// source is the checkpoint being published.
type source struct {
	// Ref is the checkpoints version, or zero for a directory.
	Ref dataset.Ref
	// Dir is the directory given, "" for a Ref until materialized.
	Dir string
}

func (s source) String() string {
	if s.Ref.Version != "" {
		return s.Ref.String()
	}
	return s.Dir
}

// resolveCheckpoint names the checkpoint for the version id: a checkpoints
// version by its pinned reference, a directory by content
// (modeldir.Identity, as kiln-train names its base). Nothing about how it
// will be encoded is part of it (docs/sync.md §1).
func resolveCheckpoint(ctx context.Context, st store.Store, arg string) (source, dataset.Identity, error) {
	id := dataset.Identity{Stage: "sync", CodeVersion: codeVersion, Inputs: []dataset.Ref{}, Args: map[string]any{}}
	if arg == "" {
		return source{}, id, stagecmd.Usagef("--checkpoint is empty: pass a checkpoints version or a model directory")
	}
	if modeldir.IsDir(arg) {
		abs, err := filepath.Abs(arg)
		if err != nil {
			return source{}, id, err
		}
		ext, err := modeldir.Identity("checkpoint", abs)
		if err != nil {
			return source{}, id, err
		}
		id.External = []dataset.External{ext}
		return source{Dir: abs}, id, nil
	}
	r, err := dataset.ParseRef(arg)
	if err != nil {
		if _, serr := os.Stat(arg); errors.Is(serr, os.ErrNotExist) {
			return source{}, id, fmt.Errorf("--checkpoint %q: no such directory, and not a dataset reference (%v): %w", arg, err, os.ErrNotExist)
		}
		return source{}, id, stagecmd.Usagef("--checkpoint %q is neither a directory nor a dataset reference: %v", arg, err)
	}
	if !r.Pinned() {
		if r.Version, err = dataset.Resolve(ctx, st, r.Name); err != nil {
			return source{}, id, fmt.Errorf("--checkpoint %q: no such directory, and %w", arg, err)
		}
	}
	id.Inputs = []dataset.Ref{r}
	return source{Ref: r}, id, nil
}

// publisher is one publish in progress.
type publisher struct {
	env *stagecmd.Env
	st  store.Store
	o   PublishOptions
	out stagecmd.Output
	src source
	ref dataset.Ref
}

func (p *publisher) hook(point string) {
	if p.out.Hook != nil {
		p.out.Hook(point)
	}
}

// claimsPrefix is where NAME's weights numbers are claimed: under a "_"
// segment, which no dataset name can have, and outside every version
// directory, so kiln gc and ls never see the claims.
func claimsPrefix(name string) string { return name + "/_weights/numbers/" }

func claimKey(name string, n int64) string { return fmt.Sprintf("%s%012d.json", claimsPrefix(name), n) }

// claim is the record of a claimed weights number.
type claim struct {
	Format    string    `json:"format"`
	Dataset   string    `json:"dataset"`
	Version   string    `json:"version"`
	Number    int64     `json:"number"`
	By        string    `json:"by"`
	ClaimedAt time.Time `json:"claimed_at"`
}

const claimFormat = "kiln.weights-claim/v1"

// listClaims returns every number claimed for name, ascending.
func listClaims(ctx context.Context, st store.Store, name string) ([]int64, error) {
	prefix := claimsPrefix(name)
	var out []int64
	err := st.List(ctx, prefix, func(info store.Info) error {
		base, ok := strings.CutSuffix(strings.TrimPrefix(info.Key, prefix), ".json")
		if n, err := strconv.ParseInt(base, 10, 64); ok && err == nil && len(base) == 12 && n > 0 {
			out = append(out, n)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("weights %s: listing claimed numbers in %s: %w", name, st.URI(), err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

// claimNumber claims 1 + the highest number ever claimed for the dataset
// (docs/sync.md §1) by create-if-absent; a lost race claims the next one.
// It returns the number and the claims seen below it.
func (p *publisher) claimNumber(ctx context.Context) (int64, []int64, error) {
	claims, err := listClaims(ctx, p.st, p.ref.Name)
	if err != nil {
		return 0, nil, err
	}
	n := int64(1)
	if len(claims) > 0 {
		n = claims[len(claims)-1] + 1
	}
	by := dataset.ThisProcess("sync").String()
	for range 1000 {
		b, _ := json.MarshalIndent(claim{Format: claimFormat, Dataset: p.ref.Name, Version: p.ref.Version, Number: n, By: by, ClaimedAt: time.Now().UTC()}, "", " ")
		_, err := p.st.PutIfAbsent(ctx, claimKey(p.ref.Name, n), bytes.NewReader(b), int64(len(b)))
		switch {
		case err == nil:
			return n, claims, nil
		case errors.Is(err, store.ErrExist):
			claims = append(claims, n)
			n++
		default:
			return 0, nil, fmt.Errorf("weights %s: claiming number %d (%q): %w", p.ref.Name, n, claimKey(p.ref.Name, n), err)
		}
	}
	return 0, nil, fmt.Errorf("weights %s: lost 1000 races for a weights number in a row", p.ref.Name)
}

// forwardOnly is the latest pointer's condition (docs/sync.md §1): move
// only past a version with a lower weights number. A pointer that names
// something this stage cannot read as weights is replaced.
func (p *publisher) forwardOnly(ctx context.Context, cur *dataset.Latest) (bool, error) {
	if cur == nil {
		return true, nil
	}
	mine, err := p.myNumber(ctx)
	if err != nil {
		return false, err
	}
	v, err := dataset.Open(ctx, p.st, cur.Ref())
	if err != nil {
		if errors.Is(err, dataset.ErrNotFound) || errors.Is(err, dataset.ErrCorrupt) {
			return true, nil
		}
		return false, err
	}
	n, ok := v.Metrics[metricNumber].(float64)
	if !ok {
		return true, nil
	}
	if int64(n) >= mine {
		p.env.Log.Info("latest stays at a higher weights number", "latest", cur.Ref().String(), "latest_number", int64(n), "this", p.ref.String(), "number", mine)
		return false, nil
	}
	return true, nil
}

// myNumber is the committed version's weights number, read from its
// manifest: not the number this run claimed, since a racing publish of
// the same checkpoint may have committed the version with its own.
func (p *publisher) myNumber(ctx context.Context) (int64, error) {
	v, err := dataset.Open(ctx, p.st, p.ref)
	if err != nil {
		return 0, err
	}
	f, ok := v.Metrics[metricNumber].(float64)
	if !ok || f < 1 {
		return 0, fmt.Errorf("weights %s: manifest has no %s: %w", p.ref, metricNumber, dataset.ErrCorrupt)
	}
	return int64(f), nil
}

// plan is what a publish decided before uploading.
type plan struct {
	ck         *checkpoint
	number     int64
	base       *weightsVersion // nil for a full version without one
	full       bool
	fullReason string
	// baseDir holds the base's verified bytes for xor/overwrite ("" if not).
	baseDir  string
	encoding string
	// fileSums are sha256s of non-shard files hashed while deciding.
	fileSums map[string]string
	genWith  any
}

// produce runs inside stagecmd.Write: check the checkpoint, claim the
// number, decide full or delta, upload, write the rows.
func (p *publisher) produce(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
	log := p.env.Log
	dir := p.src.Dir
	var genWith any
	if p.src.Ref.Version != "" {
		cv, err := dataset.Open(ctx, p.st, p.src.Ref)
		if err != nil {
			return nil, fmt.Errorf("--checkpoint: %w", err)
		}
		genWith = cv.Metrics[metricGeneratedWith]
		cache := p.o.CacheDir
		if cache == "" {
			home, err := os.UserCacheDir()
			if err != nil {
				return nil, stagecmd.Usagef("no cache directory for --checkpoint %s (%v): pass --cache-dir", p.src.Ref, err)
			}
			cache = filepath.Join(home, "kiln", "checkpoints")
		}
		if dir, err = modeldir.Materialize(ctx, p.st, p.src.Ref, cache, "--checkpoint"); err != nil {
			return nil, err
		}
	}
	if _, err := modeldir.Check(dir, "--checkpoint"); err != nil {
		return nil, err
	}
	ck, err := scanCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	// The base is what latest names before the number is claimed: its
	// number was claimed earlier, so it is below ours.
	baseRef, baseErr := p.latestBase(ctx)
	n, claims, err := p.claimNumber(ctx)
	if err != nil {
		return nil, err
	}
	p.hook(HookPublishClaimed)
	log.Info("claimed weights number", "dataset", p.ref.Name, "number", n, "version", p.ref.Version)

	pl := &plan{ck: ck, number: n, genWith: genWith}
	if err := p.decide(ctx, pl, baseRef, baseErr, claims); err != nil {
		return nil, err
	}
	if pl.full {
		log.Info("publishing a full version", "reason", pl.fullReason, "files", len(ck.Files))
		return p.publishFull(ctx, w, pl)
	}
	log.Info("publishing a delta", "base", pl.base.Ref.String(), "base_number", pl.base.Number, "encoding", pl.encoding)
	return p.publishDelta(ctx, w, pl)
}

// latestBase is the version latest names now, or an error saying why
// there is none to build on.
func (p *publisher) latestBase(ctx context.Context) (dataset.Ref, error) {
	l, err := dataset.ReadLatest(ctx, p.st, p.ref.Name)
	if err != nil {
		return dataset.Ref{}, err
	}
	return l.Ref(), nil
}

// decide picks full or delta and the delta's base (docs/sync.md §1.1).
func (p *publisher) decide(ctx context.Context, pl *plan, baseRef dataset.Ref, baseErr error, claims []int64) error {
	log := p.env.Log
	full := func(reason string) error {
		pl.full, pl.fullReason, pl.base = true, reason, nil
		return nil
	}
	if p.o.Full {
		return full("--full")
	}
	if baseErr != nil {
		if !errors.Is(baseErr, dataset.ErrNotFound) && !errors.Is(baseErr, dataset.ErrCorrupt) {
			return baseErr
		}
		return full(fmt.Sprintf("no committed version of %s to build on (%v)", p.ref.Name, baseErr))
	}
	base, err := openWeights(ctx, p.st, baseRef)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return full(fmt.Sprintf("the base %s cannot be read and checked: %v", baseRef, err))
	}
	if base.Number >= pl.number {
		return full(fmt.Sprintf("the base %s has weights number %d, not below this one's %d", baseRef, base.Number, pl.number))
	}
	if k := p.o.FullEvery; k > 0 && base.DeltasSinceFull+1 >= k {
		return full(fmt.Sprintf("--full-every %d: %d versions since the last full one", k, base.DeltasSinceFull+1))
	}
	for _, c := range claims {
		if c > base.Number && c < pl.number {
			return full(fmt.Sprintf("weights number %d was claimed after the base's %d and never committed before this publish started (a publish that did not complete: crashed, or racing this one)", c, base.Number))
		}
	}
	chainFull, err := chainFullRef(ctx, p.st, base)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return full(fmt.Sprintf("the chain of the base %s cannot be read: %v", baseRef, err))
	}
	if reason, err := p.sameLayout(ctx, pl, base, chainFull); err != nil {
		return err
	} else if reason != "" {
		return full(reason)
	}
	pl.base = base
	pl.encoding = records.EncReplace
	if p.o.BaseDir != "" {
		held, heldDir, err := heldVersion(p.o.BaseDir)
		switch {
		case err != nil:
			log.Warn("--base-dir unusable; changed tensors are stored whole (replace)", "err", err)
		case !held.holds(base.Ref.Name, base.Ref.Version):
			what := "nothing"
			if held != nil {
				what = dataset.Ref{Name: held.Dataset, Version: held.Version}.String()
			}
			log.Info("--base-dir does not hold the base; changed tensors are stored whole (replace)", "base", base.Ref.String(), "holds", what)
		default:
			pl.baseDir = heldDir
			pl.encoding = records.EncXOR
			if p.o.Encoding == records.EncOverwrite {
				pl.encoding = records.EncOverwrite
			}
		}
	}
	return nil
}

// chainFullRef walks base's chain back to its full version, reading
// manifests only.
func chainFullRef(ctx context.Context, st store.Store, base *weightsVersion) (dataset.Ref, error) {
	ref, full, next := base.Ref, base.Full, base.Base
	for i := 0; !full; i++ {
		if i > 1<<16 {
			return dataset.Ref{}, fmt.Errorf("the chain from %s does not end in a full version", base.Ref)
		}
		ref = dataset.Ref{Name: ref.Name, Version: next}
		v, err := dataset.Open(ctx, st, ref)
		if err != nil {
			return dataset.Ref{}, err
		}
		full, _ = v.Metrics[metricFull].(bool)
		next, _ = v.Metrics[metricBase].(string)
		if !full && next == "" {
			return dataset.Ref{}, fmt.Errorf("%s is neither full nor a delta with a base: %w", ref, dataset.ErrCorrupt)
		}
	}
	return ref, nil
}

// sameLayout reports why the checkpoint differs from the base in anything
// but tensor bytes ("" if it does not): the set of files, a non-shard
// file's bytes, a shard's size or header (compared byte for byte with the
// chain's full version, which stores it whole and whose deltas never
// change it), or a tensor's name, dtype, shape or place.
func (p *publisher) sameLayout(ctx context.Context, pl *plan, base *weightsVersion, chainFull dataset.Ref) (string, error) {
	bfiles := base.files()
	btensors := base.tensors()
	if len(bfiles) != len(pl.ck.Files) {
		return fmt.Sprintf("the checkpoint has %d files, the base %s %d", len(pl.ck.Files), base.Ref, len(bfiles)), nil
	}
	pl.fileSums = map[string]string{}
	ntensors := 0
	for i := range pl.ck.Files {
		f := &pl.ck.Files[i]
		bf := bfiles[f.Rel]
		switch {
		case bf == nil:
			return fmt.Sprintf("file %q is not in the base %s", f.Rel, base.Ref), nil
		case bf.Size != f.Size:
			return fmt.Sprintf("file %q has %d bytes, in the base %s %d", f.Rel, f.Size, base.Ref, bf.Size), nil
		}
		if f.Shard == nil {
			sum, err := modeldir.FileSHA256(f.Path)
			if err != nil {
				return "", err
			}
			if sum != bf.Checksum {
				return fmt.Sprintf("file %q differs from the base %s's", f.Rel, base.Ref), nil
			}
			pl.fileSums[f.Rel] = sum
			continue
		}
		for _, t := range f.Shard.Tensors {
			bt := btensors[t.Name]
			ntensors++
			switch {
			case bt == nil:
				return fmt.Sprintf("tensor %q of %q is not in the base %s", t.Name, f.Rel, base.Ref), nil
			case bt.File != f.Rel || bt.Offset != t.Offset || bt.Size != t.Size:
				return fmt.Sprintf("tensor %q moved: %q at %d (%d bytes), in the base %s %q at %d (%d bytes)", t.Name, f.Rel, t.Offset, t.Size, base.Ref, bt.File, bt.Offset, bt.Size), nil
			case bt.DType != t.DType || !equalShape(bt.Shape, t.Shape):
				return fmt.Sprintf("tensor %q is %s%v, in the base %s %s%v", t.Name, t.DType, t.Shape, base.Ref, bt.DType, bt.Shape), nil
			}
		}
		rc, err := p.st.GetRange(ctx, dataset.AttachmentKey(chainFull, f.Rel), 0, f.Shard.DataStart)
		if err != nil {
			if errors.Is(err, store.ErrNotExist) {
				return fmt.Sprintf("the full version %s does not store %q", chainFull, f.Rel), nil
			}
			return "", fmt.Errorf("reading the header of %q from %s: %w", f.Rel, chainFull, err)
		}
		hdr, err := io.ReadAll(io.LimitReader(rc, f.Shard.DataStart+1))
		rc.Close()
		if err != nil {
			return "", fmt.Errorf("reading the header of %q from %s: %w", f.Rel, chainFull, err)
		}
		if !bytes.Equal(hdr, f.Shard.Header) {
			return fmt.Sprintf("the safetensors header of %q differs from the base's (stored in %s)", f.Rel, chainFull), nil
		}
	}
	if ntensors != len(btensors) {
		return fmt.Sprintf("the checkpoint has %d tensors, the base %s %d", ntensors, base.Ref, len(btensors)), nil
	}
	return "", nil
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// publishFull stores every file whole, as an attachment at its own path,
// hashing each file (sha256) and each tensor (xxh3-128) as it streams
// through: one read per file, memory bounded by the copy buffers.
func (p *publisher) publishFull(ctx context.Context, w *dataset.Writer, pl *plan) (map[string]any, error) {
	var total int64
	for _, f := range pl.ck.Files {
		total += f.Size
	}
	progress := stagecmd.NewProgress(p.env.Stderr, p.env.Log, "publish", "bytes", total)
	defer progress.Done()
	rows := make([][]records.WeightsEntry, len(pl.ck.Files))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(min(p.o.Workers, 8))
	for i := range pl.ck.Files {
		f := &pl.ck.Files[i]
		g.Go(func() error {
			r, err := p.storeFile(gctx, w.Ref(), f, progress)
			if err != nil {
				return err
			}
			rows[i] = r
			p.hook(HookPublishFileStored)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var all []records.WeightsEntry
	var tensors, tensorBytes int64
	for _, r := range rows {
		for _, e := range r {
			if e.Entry == records.EntryTensor {
				tensors++
				tensorBytes += e.Size
			}
		}
		all = append(all, r...)
	}
	if err := writeRows(ctx, w, all); err != nil {
		return nil, err
	}
	m := p.metrics(pl)
	m[metricEncoding] = records.EncStored
	m[metricTensors], m[metricChangedTensors] = tensors, tensors
	m[metricTotalBytes], m[metricChangedBytes] = tensorBytes, tensorBytes
	m[metricStoredBytes] = total
	m[metricDensity] = density(tensorBytes, tensorBytes)
	return m, nil
}

// storeFile uploads one file as an attachment and returns its rows.
func (p *publisher) storeFile(ctx context.Context, ref dataset.Ref, f *ckptFile, progress *stagecmd.Progress) ([]records.WeightsEntry, error) {
	fh, err := os.Open(f.Path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint file %q: %w", f.Path, err)
	}
	defer fh.Close()
	sum := sha256.New()
	th := &tensorHasher{}
	if f.Shard != nil {
		th.tensors = f.Shard.Tensors
		th.next = f.Shard.DataStart
		th.pos = 0
	}
	r := io.TeeReader(io.NewSectionReader(fh, 0, f.Size), io.MultiWriter(sum, th, progressWriter{progress}))
	info, err := p.st.Put(ctx, dataset.AttachmentKey(ref, f.Rel), r, f.Size)
	if err != nil {
		return nil, fmt.Errorf("storing %q of the checkpoint in %s: %w", f.Rel, p.st.URI(), err)
	}
	if info.Size != 0 && info.Size != f.Size {
		return nil, fmt.Errorf("storing %q: the store holds %d bytes, the file has %d", f.Rel, info.Size, f.Size)
	}
	if th.pos != f.Size {
		return nil, fmt.Errorf("checkpoint file %q changed while it was published (%d bytes read, %d expected): publish again once it is complete", f.Path, th.pos, f.Size)
	}
	rows := []records.WeightsEntry{{Entry: records.EntryFile, Name: f.Rel, File: f.Rel, Size: f.Size,
		Checksum: hex.EncodeToString(sum.Sum(nil)), Encoding: records.EncStored, Payload: f.Rel}}
	if f.Shard != nil {
		for i, t := range f.Shard.Tensors {
			rows = append(rows, tensorRow(f.Rel, t, th.sums[i], records.EncStored))
		}
	}
	return rows, nil
}

func tensorRow(file string, t stTensor, sum, enc string) records.WeightsEntry {
	return records.WeightsEntry{Entry: records.EntryTensor, Name: t.Name, File: file, DType: t.DType,
		Shape: append([]int64{}, t.Shape...), Offset: t.Offset, Size: t.Size, Checksum: sum, Encoding: enc}
}

// tensorHasher hashes each tensor of a safetensors file as the file's bytes
// stream through it in order (the tensors are contiguous and cover the
// data area, readSafetensorsHeader checked it).
type tensorHasher struct {
	tensors []stTensor
	pos     int64 // bytes seen
	next    int64 // where the current tensor starts (tensors[len(sums)])
	h       *xxh3.Hasher
	sums    []string
}

func (t *tensorHasher) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := len(t.sums)
		if i >= len(t.tensors) {
			t.pos += int64(len(b))
			break
		}
		cur := t.tensors[i]
		if t.pos < cur.Offset { // the header
			k := min(int64(len(b)), cur.Offset-t.pos)
			t.pos += k
			b = b[k:]
			continue
		}
		if t.h == nil {
			t.h = xxh3.New()
		}
		k := min(int64(len(b)), cur.Offset+cur.Size-t.pos)
		t.h.Write(b[:k])
		t.pos += k
		b = b[k:]
		t.closeFinished()
	}
	t.closeFinished()
	return n, nil
}

// closeFinished records the sums of tensors the stream has passed (also
// empty ones).
func (t *tensorHasher) closeFinished() {
	for len(t.sums) < len(t.tensors) {
		cur := t.tensors[len(t.sums)]
		if t.pos < cur.Offset+cur.Size {
			return
		}
		if t.h == nil {
			t.h = xxh3.New()
		}
		s := t.h.Sum128()
		t.sums = append(t.sums, fmt.Sprintf("%016x%016x", s.Hi, s.Lo))
		t.h = nil
	}
}

type progressWriter struct{ p *stagecmd.Progress }

func (w progressWriter) Write(b []byte) (int, error) {
	w.p.Add(int64(len(b)))
	return len(b), nil
}

// publishDelta reads each shard once, tensor by tensor (sha256 of the file
// as it goes), and stores the payload of every tensor whose checksum
// differs from the base's row in packs; every other file and tensor is the
// base's. Shards are streamed through their hashes; changed tensors are
// encoded by up to Workers goroutines and deltaEncodeBudget bytes at once
// (deltaShard), so memory does not grow with Workers or the checkpoint.
func (p *publisher) publishDelta(ctx context.Context, w *dataset.Writer, pl *plan) (map[string]any, error) {
	var total int64
	for _, f := range pl.ck.Files {
		if f.Shard != nil {
			total += f.Size
		}
	}
	progress := stagecmd.NewProgress(p.env.Stderr, p.env.Log, "publish", "bytes", total)
	defer progress.Done()
	c, err := newCodec()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	packs := &packWriter{ctx: ctx, st: p.st, ref: w.Ref(), number: pl.number, limit: p.o.PackLimit, hook: p.hook}
	btensors := pl.base.tensors()
	var (
		all                  []records.WeightsEntry
		mu                   gosync.Mutex
		tensors, changed     int64
		totalBytes, chgBytes int64
	)
	for _, f := range pl.ck.Files {
		if f.Shard == nil {
			all = append(all, records.WeightsEntry{Entry: records.EntryFile, Name: f.Rel, File: f.Rel, Size: f.Size,
				Checksum: pl.fileSums[f.Rel], Encoding: records.EncUnchanged})
			continue
		}
		rows, sum, err := p.deltaShard(ctx, c, packs, pl, btensors, f, progress)
		if err != nil {
			packs.abort()
			return nil, err
		}
		all = append(all, records.WeightsEntry{Entry: records.EntryFile, Name: f.Rel, File: f.Rel, Size: f.Size,
			Checksum: sum, Encoding: records.EncUnchanged})
		mu.Lock()
		for _, r := range rows {
			tensors++
			totalBytes += r.Size
			if r.Encoding != records.EncUnchanged {
				changed++
				chgBytes += r.Size
			}
		}
		mu.Unlock()
		all = append(all, rows...)
	}
	stored, err := packs.close(ctx)
	if err != nil {
		return nil, err
	}
	if err := writeRows(ctx, w, all); err != nil {
		return nil, err
	}
	m := p.metrics(pl)
	m[metricEncoding] = pl.encoding
	m[metricTensors], m[metricChangedTensors] = tensors, changed
	m[metricTotalBytes], m[metricChangedBytes] = totalBytes, chgBytes
	m[metricStoredBytes] = stored
	m[metricDensity] = density(chgBytes, totalBytes)
	p.env.Log.Info("delta", "tensors", tensors, "changed_tensors", changed, "changed_bytes", chgBytes, "stored_bytes", stored)
	return m, nil
}

// deltaShard reads one shard once, in order, through the file's sha256
// and each tensor's xxh3 (tensorHasher), holding only a read buffer: most
// tensors of a delta are unchanged, and need no more. A tensor whose
// checksum differs from the base's row is read again (from the page
// cache), checked to still have the checksum streamed, and encoded and
// stored by a goroutine, with at most deltaEncodeBudget bytes of tensors
// being encoded at once (one tensor larger than that runs alone): an
// encode holds its payload and its frame (deltaTensor), so this bounds the
// buffers of a publish whatever the tensor sizes. It returns
// the shard's tensor rows and the file's sha256.
func (p *publisher) deltaShard(ctx context.Context, c *codec, packs *packWriter, pl *plan, btensors map[string]*records.WeightsEntry, f ckptFile, progress *stagecmd.Progress) ([]records.WeightsEntry, string, error) {
	fh, err := os.Open(f.Path)
	if err != nil {
		return nil, "", fmt.Errorf("checkpoint file %q: %w", f.Path, err)
	}
	defer fh.Close()
	var baseFile *os.File
	if pl.baseDir != "" {
		if baseFile, err = os.Open(filepath.Join(pl.baseDir, filepath.FromSlash(f.Rel))); err != nil {
			p.env.Log.Warn("the base's file is not in --base-dir; its changed tensors are stored whole (replace)", "file", f.Rel, "err", err)
			baseFile = nil
		} else {
			defer baseFile.Close()
		}
	}
	sum := sha256.New()
	hdr := make([]byte, f.Shard.DataStart)
	if _, err := io.ReadFull(io.NewSectionReader(fh, 0, f.Shard.DataStart), hdr); err != nil {
		return nil, "", fmt.Errorf("checkpoint file %q: %w", f.Path, err)
	}
	if !bytes.Equal(hdr, f.Shard.Header) {
		return nil, "", fmt.Errorf("checkpoint file %q changed while it was published: publish again once it is complete", f.Path)
	}
	sum.Write(hdr)
	changedWhile := func(what string) error {
		return fmt.Errorf("checkpoint file %q changed while it was published (%s): publish again once it is complete", f.Path, what)
	}
	rows := make([]records.WeightsEntry, len(f.Shard.Tensors))
	th := &tensorHasher{tensors: f.Shard.Tensors, pos: f.Shard.DataStart, next: f.Shard.DataStart}
	budget := semaphore.NewWeighted(deltaEncodeBudget)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(p.o.Workers)
	seen := 0 // tensors whose streamed checksum was looked at
	// dispatch looks at the tensors the stream has passed since the last
	// call: an unchanged one gets its row, a changed one an encoder.
	dispatch := func() error {
		for ; seen < len(th.sums); seen++ {
			i, t, streamed := seen, f.Shard.Tensors[seen], th.sums[seen]
			bt := btensors[t.Name]
			if streamed == bt.Checksum {
				rows[i] = tensorRow(f.Rel, t, streamed, records.EncUnchanged)
				continue
			}
			w := min(t.Size, deltaEncodeBudget)
			if err := budget.Acquire(gctx, w); err != nil {
				return err
			}
			g.Go(func() error {
				defer budget.Release(w)
				r, err := p.deltaTensor(gctx, c, packs, pl, bt, baseFile, fh, f.Rel, t, streamed)
				rows[i] = r
				return err
			})
		}
		return nil
	}
	buf := make([]byte, deltaReadSize)
	src := io.NewSectionReader(fh, f.Shard.DataStart, f.Size-f.Shard.DataStart)
	for {
		n, rerr := io.ReadFull(src, buf)
		if n > 0 {
			sum.Write(buf[:n])
			th.Write(buf[:n])
			progress.Add(int64(n))
			if err := dispatch(); err != nil {
				break // gctx is done: g.Wait has the cause
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			g.Go(func() error { return fmt.Errorf("checkpoint file %q: %w", f.Path, rerr) })
			break
		}
	}
	if err := g.Wait(); err != nil {
		return nil, "", err
	}
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	if th.pos != f.Size || seen != len(f.Shard.Tensors) {
		return nil, "", changedWhile(fmt.Sprintf("%d bytes read, %d expected", th.pos, f.Size))
	}
	return rows, hex.EncodeToString(sum.Sum(nil)), nil
}

// Memory of a delta publish (deltaShard).
const (
	// deltaReadSize is the read that streams a shard through its hashes.
	deltaReadSize = 1 << 20
	// deltaEncodeBudget bounds the bytes of changed tensors encoded at
	// once. An encode holds its payload and its frame (about twice its
	// tensor, deltaTensor), beside the pack upload's part buffer (16 MiB
	// in the S3 store); one tensor larger than the budget runs alone.
	deltaEncodeBudget = 32 << 20
)

// deltaTensor stores the payload of tensor t of file (open as fh), whose
// bytes the shard's stream hashed to streamed, a checksum other than its
// base row bt's. xor and replace payloads are built in one tensor-sized
// buffer: the base's bytes (checked against bt) are read into it, and the
// new bytes are streamed through their xxh3 and xored (or copied) into it,
// so an encode holds that buffer and its frame; a stream that no longer
// hashes to streamed means the file changed during the publish.
func (p *publisher) deltaTensor(ctx context.Context, c *codec, packs *packWriter, pl *plan, bt *records.WeightsEntry, baseFile, fh *os.File, file string, t stTensor, streamed string) (records.WeightsEntry, error) {
	changedWhile := fmt.Errorf("checkpoint file %q changed while it was published (tensor %q): publish again once it is complete", fh.Name(), t.Name)
	enc := pl.encoding
	if enc == records.EncOverwrite && t.Size >= maxOverwriteTensor {
		enc = records.EncXOR
	}
	if baseFile == nil {
		enc = records.EncReplace
	}
	payload := make([]byte, t.Size)
	if enc != records.EncReplace {
		_, err := io.ReadFull(io.NewSectionReader(baseFile, bt.Offset, bt.Size), payload)
		if err != nil || bt.Size != t.Size || tensorChecksum(payload) != bt.Checksum {
			// Only verified base bytes may underlie xor/overwrite.
			p.env.Log.Warn("the base's copy of a tensor in --base-dir does not match its checksum; stored whole (replace)", "tensor", t.Name, "file", file, "err", err)
			enc = records.EncReplace
		}
	}
	var frame []byte
	var err error
	if enc == records.EncOverwrite {
		buf := make([]byte, t.Size)
		if _, err := io.ReadFull(io.NewSectionReader(fh, t.Offset, t.Size), buf); err != nil {
			return records.WeightsEntry{}, fmt.Errorf("checkpoint file %q: tensor %q: %w", fh.Name(), t.Name, err)
		}
		if tensorChecksum(buf) != streamed {
			return records.WeightsEntry{}, changedWhile
		}
		frame, err = c.encode(enc, payload, buf)
	} else {
		// The xor payload is new XOR old, and replace's is new (codec.encode,
		// docs/sync.md §1.1); both are compressed as one zstd frame, which is
		// what encode does with a replace payload. TestPublishDelta's pulls
		// apply them.
		h := xxh3.New()
		chunk := make([]byte, deltaReadSize)
		for off := int64(0); off < t.Size; off += int64(len(chunk)) {
			b := chunk[:min(int64(len(chunk)), t.Size-off)]
			if _, err := io.ReadFull(io.NewSectionReader(fh, t.Offset+off, int64(len(b))), b); err != nil {
				return records.WeightsEntry{}, fmt.Errorf("checkpoint file %q: tensor %q: %w", fh.Name(), t.Name, err)
			}
			h.Write(b)
			dst := payload[off : off+int64(len(b))]
			if enc == records.EncXOR {
				for i, x := range b {
					dst[i] ^= x
				}
			} else {
				copy(dst, b)
			}
		}
		if s := h.Sum128(); fmt.Sprintf("%016x%016x", s.Hi, s.Lo) != streamed {
			return records.WeightsEntry{}, changedWhile
		}
		frame, err = c.encode(records.EncReplace, nil, payload)
	}
	if err != nil {
		return records.WeightsEntry{}, fmt.Errorf("tensor %q of %q: %w", t.Name, file, err)
	}
	pack, off, err := packs.add(frame)
	if err != nil {
		return records.WeightsEntry{}, err
	}
	r := tensorRow(file, t, streamed, enc)
	r.Payload, r.PayloadOffset, r.PayloadSize = pack, off, int64(len(frame))
	return r, nil
}

// packWriter appends zstd frames to pack attachments (packName),
// each streamed to the store as it fills and closed at the limit.
type packWriter struct {
	// ctx is the publish's: a pack outlives the workers that fill it.
	ctx    context.Context
	st     store.Store
	ref    dataset.Ref
	number int64
	limit  int64
	hook   func(string)

	mu     gosync.Mutex
	n      int   // packs opened
	stored int64 // bytes of closed packs
	cur    *openPack
}

type openPack struct {
	name string
	pw   *io.PipeWriter
	size int64
	done chan error
}

// packName is pack i of the publish that claimed weights number n. The
// number keeps the packs of two publishes racing to commit one version
// (the same checkpoint) apart: the rows that win name their own packs.
func packName(n int64, i int) string { return fmt.Sprintf("packs/pack-%012d-%05d.zst", n, i) }

// add appends frame and says where it went.
func (pw *packWriter) add(frame []byte) (string, int64, error) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.cur != nil && pw.cur.size > 0 && pw.cur.size+int64(len(frame)) > pw.limit {
		if err := pw.finish(); err != nil {
			return "", 0, err
		}
	}
	if pw.cur == nil {
		op := &openPack{name: packName(pw.number, pw.n), done: make(chan error, 1)}
		pw.n++
		pr, w := io.Pipe()
		op.pw = w
		key := dataset.AttachmentKey(pw.ref, op.name)
		go func() {
			_, err := pw.st.Put(pw.ctx, key, pr, -1)
			pr.CloseWithError(err)
			op.done <- err
		}()
		pw.cur = op
	}
	off := pw.cur.size
	if _, err := pw.cur.pw.Write(frame); err != nil {
		return "", 0, fmt.Errorf("storing %s of %s: %w", pw.cur.name, pw.ref, err)
	}
	pw.cur.size += int64(len(frame))
	return pw.cur.name, off, nil
}

// finish closes the open pack and waits for the store to have it.
func (pw *packWriter) finish() error {
	op := pw.cur
	pw.cur = nil
	op.pw.Close()
	if err := <-op.done; err != nil {
		return fmt.Errorf("storing %s of %s: %w", op.name, pw.ref, err)
	}
	pw.stored += op.size
	pw.hook(HookPublishPackStored)
	return nil
}

// close finishes the last pack and returns the bytes stored in packs.
func (pw *packWriter) close(ctx context.Context) (int64, error) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.cur != nil {
		if err := pw.finish(); err != nil {
			return 0, err
		}
	}
	return pw.stored, ctx.Err()
}

// abort stops an open pack's upload: the store keeps no partial object.
func (pw *packWriter) abort() {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.cur != nil {
		pw.cur.pw.CloseWithError(errors.New("publish failed"))
		<-pw.cur.done
		pw.cur = nil
	}
}

// writeRows sorts the rows (docs/records.md §12) and writes them as the
// version's one shard.
func writeRows(ctx context.Context, w *dataset.Writer, rows []records.WeightsEntry) error {
	sort.SliceStable(rows, func(i, j int) bool { return entryLess(&rows[i], &rows[j]) })
	_, err := w.WriteShard(ctx, int64(len(rows)), nil, func(wr io.Writer) error {
		enc, err := records.NewWeightsEncoder(wr, records.ArrowOptions{})
		if err != nil {
			return err
		}
		if err := enc.Write(rows...); err != nil {
			return err
		}
		return enc.Close()
	})
	return err
}

// metrics are the manifest metrics every version has (docs/sync.md §1.3).
func (p *publisher) metrics(pl *plan) map[string]any {
	m := map[string]any{
		metricNumber: pl.number, metricFull: pl.full, metricFullReason: pl.fullReason,
		metricBase: "", metricBaseNumber: int64(0), metricDeltasSinceFull: 0, metricSource: p.src.String(),
	}
	if pl.base != nil {
		m[metricBase], m[metricBaseNumber], m[metricDeltasSinceFull] = pl.base.Ref.Version, pl.base.Number, pl.base.DeltasSinceFull+1
	}
	if pl.genWith != nil {
		m[metricGeneratedWith] = pl.genWith
	}
	return m
}

func density(changed, total int64) float64 {
	if total == 0 {
		return 0
	}
	return float64(changed) / float64(total)
}
