package sync

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	gosync "sync"

	"golang.org/x/sync/errgroup"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Hook points of a pull (stagecmd.Env.Hook): the crash tests kill a pull
// at each and check the previous version is still held.
const (
	HookPullSeeded  = "sync-pull-seeded"  // staging holds the seed's files
	HookPullApplied = "sync-pull-applied" // one delta applied in staging, not yet verified
	HookPullRenamed = "sync-pull-renamed" // the new version's directory is in place; state.json not yet written
	HookPullState   = "sync-pull-state"   // state.json names the new version; current not yet swapped
)

// Defaults of PullOptions.
const (
	defaultPullWorkers = 4
	// defaultChunkSize is small enough that the hash of a file trails
	// its GETs by little, large enough that a GET's overhead is lost in
	// its bytes; memory does not depend on it (see download).
	defaultChunkSize = 16 << 20
	// maxChain bounds the walk back to a full version: --full-every
	// defaults to 16, so a longer chain means a broken one.
	maxChain = 10000
	// maxNamed bounds the tensors or files a mismatch error names.
	maxNamed = 20
)

// PullOptions tune a pull; the zero value is the defaults.
type PullOptions struct {
	// Workers bounds the concurrent ranged GETs and tensor applications
	// (default 4). Memory is about Workers tensors.
	Workers int
	// ChunkSize is the length of one ranged GET when a full version's
	// files are downloaded (default 16 MiB). GETs write straight into the
	// staged file, so it does not set the memory used.
	ChunkSize int64
}

// PullResult is what a pull did.
type PullResult struct {
	// Ref is the version DIR now holds and Number its weights number.
	Ref    dataset.Ref
	Number int64
	// ModelDir is the version's directory, DIR/NNNNNN-<id>: the path an
	// engine loads (kiln-sync reload --path).
	ModelDir string
	// AlreadyHeld: DIR held Ref already; nothing was done.
	AlreadyHeld bool
	// Previous is the version DIR held before ("" if none).
	Previous string
	// Seed is where the bytes started: the version DIR held, or the full
	// version downloaded; Deltas is the number of deltas applied on it.
	Seed       string
	SeedHeld   bool
	Deltas     int
	Downloaded int64 // bytes of whole files downloaded
	Patched    int   // tensors a delta changed
}

// Pull makes dir hold the weights version ref names, byte for byte
// (docs/sync.md §2): the chain of bases is walked back to a full version
// or to the version dir holds, the seed's files are cloned from the held
// directory (never written) or downloaded and checked, every delta is
// applied in order in a staging directory, every changed tensor and every
// file is checked against ref's rows, and only then is the directory
// renamed into place, state.json written and current swapped. Any
// mismatch is an error satisfying stagecmd.CorruptError (exit 4) naming up
// to 20 tensors or files, and leaves dir's state and held version as they
// were; a missing version in the chain is dataset.ErrNotFound (exit 3). A
// pull of the version dir holds does nothing. Pulls into one dir take
// turns (flock); a pull killed anywhere leaves the previous version held,
// and a rerun completes it.
func Pull(ctx context.Context, env *stagecmd.Env, st store.Store, ref dataset.Ref, dir string, o PullOptions) (PullResult, error) {
	if o.Workers <= 0 {
		o.Workers = defaultPullWorkers
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = defaultChunkSize
	}
	hook := env.Hook
	if hook == nil {
		hook = func(string) {}
	}
	log := env.Log
	if !ref.Pinned() {
		v, err := dataset.Resolve(ctx, st, ref.Name)
		if err != nil {
			return PullResult{}, err
		}
		ref.Version = v
	}
	target, err := openWeights(ctx, st, ref)
	if err != nil {
		return PullResult{}, err
	}
	if err := prepareDir(dir); err != nil {
		return PullResult{}, err
	}
	// The printed directory is what engines load: absolute, so it means
	// the same to a process started elsewhere.
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	unlock, err := lockLocal(ctx, dir, log)
	if err != nil {
		return PullResult{}, unwritable(dir, err)
	}
	defer unlock()
	if err := removeLeftovers(dir); err != nil {
		return PullResult{}, err
	}
	held, heldDir, err := heldVersion(dir)
	if err != nil {
		return PullResult{}, stagecmd.CorruptError{Err: err}
	}
	res := PullResult{Ref: target.Ref, Number: target.Number, ModelDir: filepath.Join(dir, versionDirName(target.Number, target.Ref.Version))}
	if held != nil {
		res.Previous = dataset.Ref{Name: held.Dataset, Version: held.Version}.String()
	}
	if held.holds(ref.Name, ref.Version) {
		if held.Number != target.Number {
			return PullResult{}, stagecmd.CorruptError{Err: fmt.Errorf("weights directory %q: %s says %s is weights %d, the store says %d: remove %s and pull again", dir, stateFile, ref, held.Number, target.Number, stateFile)}
		}
		// A pull killed after its state but before current moved left
		// current behind: point it at what state.json names.
		if err := swapCurrent(dir, held.Dir); err != nil {
			return PullResult{}, err
		}
		res.AlreadyHeld, res.ModelDir = true, heldDir
		log.Info("already held; nothing to do", "weights", ref.String(), "number", target.Number, "dir", heldDir)
		return res, nil
	}

	chain, seedHeld, err := walkChain(ctx, st, target, held)
	if err != nil {
		return PullResult{}, err
	}
	seed := chain[0]
	res.Seed, res.SeedHeld, res.Deltas = seed.Ref.String(), seedHeld, len(chain)-1
	log.Info("pulling", "weights", ref.String(), "number", target.Number, "seed", seed.Ref.String(),
		"seed_from", map[bool]string{true: "held directory", false: "store"}[seedHeld], "deltas", len(chain)-1, "dir", dir)

	staging, err := os.MkdirTemp(dir, stagingPrefix)
	if err != nil {
		return PullResult{}, unwritable(dir, err)
	}
	placed := false
	defer func() {
		if !placed {
			os.RemoveAll(staging)
		}
	}()
	p := &puller{ctx: ctx, st: st, env: env, dir: dir, staging: staging, o: o, checked: map[string]string{}}
	if seedHeld {
		err = p.seedFromHeld(seed, heldDir)
	} else {
		res.Downloaded, err = p.download(seed)
	}
	if err != nil {
		return PullResult{}, err
	}
	hook(HookPullSeeded)
	c, err := newCodec()
	if err != nil {
		return PullResult{}, err
	}
	defer c.Close()
	for i := 1; i < len(chain); i++ {
		n, err := p.applyDelta(c, chain[i-1], chain[i])
		if err != nil {
			return PullResult{}, err
		}
		res.Patched += n
		hook(HookPullApplied)
	}
	if err := p.verify(target); err != nil {
		return PullResult{}, err
	}

	// In place: rename, then state, then current (docs/sync.md §2 step 4).
	final := res.ModelDir
	if _, err := os.Lstat(final); err == nil {
		// A pull killed between its rename and its state left it; it is
		// not held (state names another), so no engine loads it.
		if err := removeTree(final); err != nil {
			return PullResult{}, fmt.Errorf("weights directory %q: removing %q, which a killed pull left: %w", dir, final, err)
		}
	}
	if err := os.Rename(staging, final); err != nil {
		return PullResult{}, fmt.Errorf("weights directory %q: moving the verified version into place: %w", dir, err)
	}
	placed = true
	if err := syncDir(dir); err != nil {
		return PullResult{}, err
	}
	hook(HookPullRenamed)
	name := filepath.Base(final)
	if err := writeState(dir, localState{Dataset: target.Ref.Name, Version: target.Ref.Version, Number: target.Number, Dir: name}); err != nil {
		return PullResult{}, err
	}
	hook(HookPullState)
	if err := swapCurrent(dir, name); err != nil {
		return PullResult{}, err
	}
	keep := []string{name}
	if held != nil {
		keep = append(keep, held.Dir)
	}
	pruneVersions(dir, log, keep...)
	log.Info("pulled", "weights", target.Ref.String(), "number", target.Number, "dir", final,
		"deltas", res.Deltas, "tensors_patched", res.Patched, "downloaded_bytes", res.Downloaded)
	return res, nil
}

// prepareDir makes --to exist as a directory. One that names a file is a
// usage error (as a --store that is a file is); one the process cannot
// create is exit 1, its cause written out rather than wrapped, so a
// missing parent on a read-only mount does not read as "not found".
func prepareDir(dir string) error {
	if dir == "" {
		return stagecmd.Usagef("--to is empty: give the directory to pull into")
	}
	fi, err := os.Stat(dir)
	switch {
	case err == nil && !fi.IsDir():
		return stagecmd.Usagef("--to %q is a file, not a directory: give the directory to pull into", dir)
	case err == nil:
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return unwritable(dir, err)
	}
	return nil
}

// unwritable is the error for a --to the process cannot write: exit 1
// (stagecmd.ExitFailure), because the command line is well formed and a
// fixed mount or permission makes the same command work; the cause is
// written out, not wrapped, so an ENOENT does not read as exit 3.
func unwritable(dir string, err error) error {
	return fmt.Errorf("--to %q: cannot write the weights directory: %v; pull into a directory this user may create files in (check the mount, owner and mode)", dir, err)
}

// walkChain returns the versions from the seed to target, oldest first:
// the bases of target back to a full version, or back to the version
// held (then seedHeld is true) when it is in the chain. A version of the
// chain that is missing is dataset.ErrNotFound naming it.
func walkChain(ctx context.Context, st store.Store, target *weightsVersion, held *localState) (chain []*weightsVersion, seedHeld bool, err error) {
	chain = []*weightsVersion{target}
	cur := target
	seen := map[string]bool{target.Ref.Version: true}
	for !cur.Full {
		baseRef := dataset.Ref{Name: cur.Ref.Name, Version: cur.Base}
		if seen[cur.Base] || len(chain) > maxChain {
			return nil, false, fmt.Errorf("weights %s: the chain of bases loops or is longer than %d at %s: %w; publish a full version (kiln-sync publish --full)", target.Ref, maxChain, baseRef, dataset.ErrCorrupt)
		}
		seen[cur.Base] = true
		base, err := openWeights(ctx, st, baseRef)
		if errors.Is(err, dataset.ErrNotFound) || errors.Is(err, store.ErrNotExist) {
			return nil, false, fmt.Errorf("weights %s: version %s (weights %d), the base of %s in its chain back to a full version, is missing: %w; publish a full version (kiln-sync publish --full) and pull that", target.Ref, baseRef, cur.BaseNumber, cur.Ref, err)
		}
		if err != nil {
			return nil, false, fmt.Errorf("weights %s: reading %s, the base of %s: %w", target.Ref, baseRef, cur.Ref, err)
		}
		if base.Number != cur.BaseNumber {
			return nil, false, fmt.Errorf("weights %s: %s names base %s as weights %d, but it is weights %d: %w", target.Ref, cur.Ref, baseRef, cur.BaseNumber, base.Number, dataset.ErrCorrupt)
		}
		chain = append(chain, base)
		if held.holds(baseRef.Name, baseRef.Version) {
			seedHeld = true
			break
		}
		cur = base
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	return chain, seedHeld, nil
}

// puller is one pull's staging work.
type puller struct {
	ctx          context.Context
	st           store.Store
	env          *stagecmd.Env
	dir, staging string
	o            PullOptions
	// checked maps a staged file to the sha256 it was checked to have
	// as it was downloaded; a delta that patches the file removes it.
	// verify does not hash these again.
	checked map[string]string
}

// stagedPath is where file rel of the version is staged.
func (p *puller) stagedPath(rel string) (string, error) {
	if !filepath.IsLocal(filepath.FromSlash(rel)) {
		return "", stagecmd.CorruptError{Err: fmt.Errorf("weights file %q: not a relative path inside the model directory", rel)}
	}
	return filepath.Join(p.staging, filepath.FromSlash(rel)), nil
}

// seedFromHeld clones (or copies) the files the seed version's rows list
// from the held directory. Only those: a file the rows do not name (a
// stale shard no index lists) is not carried over, and one they name that
// is missing fails the pull, since the held directory was changed after
// it was pulled. The held directory is only read.
func (p *puller) seedFromHeld(seed *weightsVersion, heldDir string) error {
	for _, e := range seed.Entries {
		if e.Entry != records.EntryFile {
			continue
		}
		dst, err := p.stagedPath(e.Name)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		src := filepath.Join(heldDir, filepath.FromSlash(e.Name))
		fi, err := os.Stat(src)
		if err == nil && fi.Size() != e.Size {
			err = fmt.Errorf("%d bytes, want %d", fi.Size(), e.Size)
		}
		if err != nil {
			return stagecmd.CorruptError{Err: fmt.Errorf("weights directory %q: the held version %s lacks its file %q as pulled (%v): the directory was changed after the pull; remove %s and pull again (the pull then starts from a full version)",
				p.dir, seed.Ref, e.Name, err, filepath.Join(p.dir, stateFile))}
		}
		if _, err := cloneFile(src, dst); err != nil {
			return fmt.Errorf("weights directory %q: copying %q of the held version: %w", p.dir, e.Name, err)
		}
	}
	return nil
}

// download fetches every file of the full version seed into staging and
// checks each against its row's size and sha256 as it arrives, so no file
// is read twice (docs/sync.md §2 step 2). Up to filesAtOnce files are
// fetched at once; each is cut into ChunkSize ranges, fetched by parallel
// ranged GETs (Workers in flight over all files) that write straight into
// the staged file, and one goroutine per file hashes the ranges in order
// as they land, reading them back from the page cache, at most
// readAhead ranges behind the newest GET. Memory is a copy buffer per GET
// and a hash buffer per file, whatever ChunkSize is. A file that checks
// is fsynced and recorded in p.checked, so the final verification does
// not hash it again unless a delta patches it. It returns the bytes
// downloaded.
func (p *puller) download(seed *weightsVersion) (int64, error) {
	var total int64
	var files []records.WeightsEntry
	for _, e := range seed.Entries {
		if e.Entry == records.EntryFile {
			if e.Encoding != records.EncStored || e.Payload == "" {
				return 0, fmt.Errorf("weights %s: file %q is %q in a full version, want stored: %w", seed.Ref, e.Name, e.Encoding, dataset.ErrCorrupt)
			}
			files = append(files, e)
			total += e.Size
		}
	}
	if p.checked == nil {
		p.checked = map[string]string{}
	}
	prog := stagecmd.NewProgress(p.env.Stderr, p.env.Log, "download "+seed.Ref.String(), stagecmd.UnitBytes, total)
	defer prog.Done()
	handles := make([]*os.File, len(files))
	defer func() {
		for _, f := range handles {
			if f != nil {
				f.Close()
			}
		}
	}()
	for i, e := range files {
		path, err := p.stagedPath(e.Name)
		if err != nil {
			return 0, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return 0, err
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return 0, err
		}
		handles[i] = f
		if err := f.Truncate(e.Size); err != nil {
			return 0, fmt.Errorf("weights %s: staging %q: %w", seed.Ref, e.Name, err)
		}
	}
	// copyBufs is the pool of GET copy buffers and, by its size, the bound
	// on GETs in flight over all files.
	copyBufs := make(chan []byte, p.o.Workers)
	for range p.o.Workers {
		copyBufs <- make([]byte, copyBufSize)
	}
	msgs := make([]string, len(files))
	g, ctx := errgroup.WithContext(p.ctx)
	g.SetLimit(min(p.o.Workers, filesAtOnce))
	for i := range files {
		g.Go(func() error {
			msg, err := p.fetchFile(ctx, seed, &files[i], handles[i], copyBufs, prog)
			msgs[i] = msg
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	var bad []string
	for i, e := range files {
		if msgs[i] != "" {
			bad = append(bad, fmt.Sprintf("%s (%s)", e.Name, msgs[i]))
			continue
		}
		p.checked[e.Name] = e.Checksum
	}
	if len(bad) > 0 {
		return 0, mismatch(fmt.Sprintf("weights %s: the files downloaded differ from the version's rows", seed.Ref), "files", bad,
			"the store's copy is damaged: check it with `kiln verify "+seed.Ref.String()+"`, or publish a new full version")
	}
	return total, nil
}

// Tuning of download. Memory is copyBufSize per GET and per file hashed,
// whatever the values; they were chosen, not swept (BenchmarkSync on a
// loaded 2-core machine cannot tell them apart): 4 GETs of 16 MiB keep
// one file's hash fed, and 4 files hash on 4 cores.
const (
	// filesAtOnce bounds the files fetched, and so hashed, at once.
	filesAtOnce = 4
	// readAhead is how many ranges of one file may be fetched or waiting
	// to be hashed at once: the hash of range i runs while the GETs of
	// ranges i+1..i+readAhead-1 are in flight.
	readAhead = 4
	// copyBufSize is the buffer one GET copies through, and the read size
	// of a file's hash: large enough that a syscall moves a lot, small
	// enough to stay in cache between the copy and the hash.
	copyBufSize = 1 << 20
)

// fetchFile fetches file e of seed into f (already sized) with ranged
// GETs and hashes it in order as the ranges land (see download). It
// returns "" when f holds e's size and sha256, else what differs; err is
// a failure to read or write, or a range the store returned short.
func (p *puller) fetchFile(ctx context.Context, seed *weightsVersion, e *records.WeightsEntry, f *os.File, copyBufs chan []byte, prog *stagecmd.Progress) (msg string, err error) {
	key := dataset.AttachmentKey(seed.Ref, e.Payload)
	nChunks := int((e.Size + p.o.ChunkSize - 1) / p.o.ChunkSize)
	fg, fctx := errgroup.WithContext(ctx)
	defer func() {
		if werr := fg.Wait(); err == nil {
			err = werr
		}
	}()
	landed := make([]chan struct{}, nChunks)
	launch := func(i int) {
		landed[i] = make(chan struct{})
		off := int64(i) * p.o.ChunkSize
		n := min(p.o.ChunkSize, e.Size-off)
		fg.Go(func() error {
			var buf []byte
			select {
			case buf = <-copyBufs:
			case <-fctx.Done():
				return fctx.Err()
			}
			defer func() { copyBufs <- buf }()
			rc, err := p.st.GetRange(fctx, key, off, n)
			if err != nil {
				return fmt.Errorf("weights %s: reading %q at %d: %w", seed.Ref, e.Name, off, err)
			}
			defer rc.Close()
			got, err := io.CopyBuffer(io.NewOffsetWriter(f, off), io.LimitReader(rc, n+1), buf)
			if err == nil && got != n {
				err = fmt.Errorf("got %d bytes of the range, want %d: %w", got, n, dataset.ErrCorrupt)
			}
			if err != nil {
				return fmt.Errorf("weights %s: reading %q at %d: %w", seed.Ref, e.Name, off, err)
			}
			prog.Add(n)
			close(landed[i])
			return nil
		})
	}
	h := sha256.New()
	hbuf := make([]byte, copyBufSize)
	next := 0
	for i := range nChunks {
		for ; next < nChunks && next < i+readAhead; next++ {
			launch(next)
		}
		select {
		case <-landed[i]:
		case <-fctx.Done():
			// A GET of this file failed, or the pull is being stopped.
			werr := fg.Wait()
			if werr == nil {
				werr = context.Cause(ctx)
			}
			return "", werr
		}
		off := int64(i) * p.o.ChunkSize
		n := min(p.o.ChunkSize, e.Size-off)
		if _, err := io.CopyBuffer(h, io.NewSectionReader(f, off, n), hbuf); err != nil {
			return "", fmt.Errorf("weights %s: hashing staged %q: %w", seed.Ref, e.Name, err)
		}
	}
	if err := fg.Wait(); err != nil {
		return "", err
	}
	// The file was created empty and sized to e.Size; a range past it
	// would have failed above. Stat says nothing grew it since.
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("weights %s: staged %q: %w", seed.Ref, e.Name, err)
	}
	if fi.Size() != e.Size {
		return fmt.Sprintf("%d bytes, want %d", fi.Size(), e.Size), nil
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != e.Checksum {
		return fmt.Sprintf("sha256 %s, want %s", got, e.Checksum), nil
	}
	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("fsync staged %q: %w", e.Name, err)
	}
	return "", nil
}

// checkFile returns "" when f holds the size and sha256 of row e, else
// what differs.
func checkFile(f *os.File, e *records.WeightsEntry) string {
	h := sha256.New()
	n, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<62))
	switch {
	case err != nil:
		return err.Error()
	case n != e.Size:
		return fmt.Sprintf("%d bytes, want %d", n, e.Size)
	case hex.EncodeToString(h.Sum(nil)) != e.Checksum:
		return fmt.Sprintf("sha256 %s, want %s", hex.EncodeToString(h.Sum(nil)), e.Checksum)
	}
	return ""
}

// applyDelta applies delta d to the staged bytes of its base b: each
// changed tensor's region is read, checked against b's checksum (xor and
// overwrite, which need the base's exact bytes), patched with its payload,
// checked against d's checksum, and written back. Memory is a few tensors
// (one per worker). It returns the tensors patched; any mismatch fails
// naming them (exit 4).
func (p *puller) applyDelta(c *codec, b, d *weightsVersion) (int, error) {
	if d.Base != b.Ref.Version {
		return 0, stagecmd.CorruptError{Err: fmt.Errorf("weights %s is a delta on %s@%s, not on %s: it does not apply to these bytes", d.Ref, d.Ref.Name, d.Base, b.Ref)}
	}
	base := b.tensors()
	var work []*records.WeightsEntry
	var bad []string
	for i := range d.Entries {
		e := &d.Entries[i]
		if e.Entry != records.EntryTensor {
			continue
		}
		bt := base[e.Name]
		switch {
		case bt == nil || bt.File != e.File || bt.Offset != e.Offset || bt.Size != e.Size:
			bad = append(bad, fmt.Sprintf("%s (not where the base %s has it)", e.Name, b.Ref))
		case e.Encoding == records.EncUnchanged && bt.Checksum != e.Checksum:
			bad = append(bad, fmt.Sprintf("%s (unchanged, yet checksum %s, the base's %s)", e.Name, e.Checksum, bt.Checksum))
		case e.Encoding == records.EncXOR || e.Encoding == records.EncOverwrite || e.Encoding == records.EncReplace:
			work = append(work, e)
		}
	}
	if len(bad) > 0 {
		return 0, mismatch(fmt.Sprintf("weights %s: rows disagree with its base %s", d.Ref, b.Ref), "tensors", bad, "publish a full version (kiln-sync publish --full)")
	}
	var total int64
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, e := range work {
		total += e.Size
		// The file's bytes change: its download check no longer holds.
		delete(p.checked, e.File)
		if files[e.File] == nil {
			path, err := p.stagedPath(e.File)
			if err != nil {
				return 0, err
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				return 0, fmt.Errorf("weights %s: staged file %q: %w", d.Ref, e.File, err)
			}
			files[e.File] = f
		}
	}
	prog := stagecmd.NewProgress(p.env.Stderr, p.env.Log, "apply "+d.Ref.String(), stagecmd.UnitBytes, total)
	defer prog.Done()
	var mu gosync.Mutex
	g, ctx := errgroup.WithContext(p.ctx)
	g.SetLimit(p.o.Workers)
	for _, e := range work {
		g.Go(func() error {
			msg, err := p.applyTensor(ctx, c, d, base[e.Name], e, files[e.File])
			if err != nil {
				return err
			}
			if msg != "" {
				mu.Lock()
				bad = append(bad, fmt.Sprintf("%s (%s)", e.Name, msg))
				mu.Unlock()
			}
			prog.Add(e.Size)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return 0, mismatch(fmt.Sprintf("weights %s: applying the delta on %s failed its checks", d.Ref, b.Ref), "tensors", bad,
			fmt.Sprintf("nothing in %q changed; if the store's copy is damaged (`kiln verify %s`), publish a full version (kiln-sync publish --full); if the local copy is, remove %s and pull again", p.dir, d.Ref, filepath.Join(p.dir, stateFile)))
	}
	return len(work), nil
}

// applyTensor patches one tensor in f. A check that fails is returned as
// msg (collected and named); err is a failure to read or write.
func (p *puller) applyTensor(ctx context.Context, c *codec, d *weightsVersion, bt, e *records.WeightsEntry, f *os.File) (msg string, err error) {
	buf := make([]byte, e.Size)
	if _, err := f.ReadAt(buf, e.Offset); err != nil {
		if errors.Is(err, io.EOF) {
			return "the staged file ends inside it", nil
		}
		return "", fmt.Errorf("weights %s: reading tensor %q of staged %q: %w", d.Ref, e.Name, e.File, err)
	}
	if e.Encoding != records.EncReplace {
		if got := tensorChecksum(buf); got != bt.Checksum {
			return fmt.Sprintf("base bytes have checksum %s, want the base's %s: the %s payload does not apply to them", got, bt.Checksum, e.Encoding), nil
		}
	}
	key := dataset.AttachmentKey(d.Ref, e.Payload)
	rc, err := p.st.GetRange(ctx, key, e.PayloadOffset, e.PayloadSize)
	if errors.Is(err, store.ErrNotExist) {
		return "", fmt.Errorf("weights %s: pack %q of tensor %q: %w", d.Ref, e.Payload, e.Name, dataset.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("weights %s: reading tensor %q from pack %q: %w", d.Ref, e.Name, e.Payload, err)
	}
	frame, err := io.ReadAll(io.LimitReader(rc, e.PayloadSize+1))
	rc.Close()
	if err != nil {
		return "", fmt.Errorf("weights %s: reading tensor %q from pack %q: %w", d.Ref, e.Name, e.Payload, err)
	}
	if int64(len(frame)) != e.PayloadSize {
		return fmt.Sprintf("pack %q holds %d bytes of its payload, want %d", e.Payload, len(frame), e.PayloadSize), nil
	}
	if err := c.apply(e.Encoding, buf, frame); err != nil {
		return err.Error(), nil
	}
	if got := tensorChecksum(buf); got != e.Checksum {
		return fmt.Sprintf("patched bytes have checksum %s, want %s", got, e.Checksum), nil
	}
	if _, err := f.WriteAt(buf, e.Offset); err != nil {
		return "", fmt.Errorf("weights %s: writing tensor %q of staged %q: %w", d.Ref, e.Name, e.File, err)
	}
	return "", nil
}

// verify checks the staged directory is target's: exactly its files,
// each of its size and sha256, each fsynced, and the directories too.
// A file download checked against the same row (p.checked) and no delta
// touched since is only fsynced; every other file (cloned from the held
// directory, or patched) is hashed, up to Workers files at once.
func (p *puller) verify(target *weightsVersion) error {
	want := target.files()
	var files []records.WeightsEntry
	for _, e := range target.Entries {
		if e.Entry == records.EntryFile {
			files = append(files, e)
		}
	}
	msgs := make([]string, len(files))
	g, ctx := errgroup.WithContext(p.ctx)
	g.SetLimit(p.o.Workers)
	for i := range files {
		e := &files[i]
		path, err := p.stagedPath(e.Name)
		if err != nil {
			return err
		}
		sum, checked := p.checked[e.Name]
		checked = checked && sum == e.Checksum
		g.Go(func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				msgs[i] = err.Error()
				return nil
			}
			defer f.Close()
			if checked {
				// Downloaded checked and untouched since; its size is
				// still looked at, which costs nothing.
				if fi, err := f.Stat(); err != nil || fi.Size() != e.Size {
					checked = false
				}
			}
			if !checked {
				if msgs[i] = checkFile(f, e); msgs[i] != "" {
					return nil
				}
			}
			if err := f.Sync(); err != nil {
				return fmt.Errorf("fsync %q: %w", path, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	var bad []string
	for i, e := range files {
		if msgs[i] != "" {
			bad = append(bad, fmt.Sprintf("%s (%s)", e.Name, msgs[i]))
		}
	}
	var dirs []string
	err := filepath.WalkDir(p.staging, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.IsDir() {
			dirs = append(dirs, path)
			return nil
		}
		rel, _ := filepath.Rel(p.staging, path)
		if want[filepath.ToSlash(rel)] == nil {
			bad = append(bad, fmt.Sprintf("%s (not a file of the version)", filepath.ToSlash(rel)))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(bad) > 0 {
		return mismatch(fmt.Sprintf("weights %s: the reconstructed files differ from the version's rows", target.Ref), "files", bad,
			fmt.Sprintf("nothing in %q changed; check the store with `kiln verify %s`, or publish a full version (kiln-sync publish --full)", p.dir, target.Ref))
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syncDir(dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

// mismatch is a CorruptError (exit 4) naming up to maxNamed items.
func mismatch(what, noun string, items []string, next string) error {
	named := items
	more := ""
	if len(named) > maxNamed {
		named, more = named[:maxNamed], fmt.Sprintf(" and %d more", len(items)-maxNamed)
	}
	return stagecmd.CorruptError{Err: fmt.Errorf("%s: %d %s: %s%s: %s", what, len(items), noun, strings.Join(named, ", "), more, next)}
}
