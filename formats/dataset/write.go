package dataset

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
)

// Part says which part of a sharded write this process produces: Index in
// [0, Count). The zero value means the whole version in one part.
type Part struct {
	Index, Count int
}

func (p Part) count() int { return max(p.Count, 1) }

// Owns reports whether row i of the input belongs to this part (rows are
// dealt round-robin, so parts stay balanced whatever the input's order).
func (p Part) Owns(i int) bool { return i%p.count() == p.Index }

func (p Part) String() string { return fmt.Sprintf("%d/%d", p.Index, p.count()) }

// ParsePart parses "i/n".
func ParsePart(s string) (Part, error) {
	a, b, ok := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return Part{}, fmt.Errorf("shard %q: want i/n with 0 <= i < n", s)
	}
	return Part{Index: i, Count: n}, nil
}

// Spec describes the version a writer produces.
type Spec struct {
	Name     string
	Kind     records.Kind
	Identity Identity
	Part     Part
	// Build identifies the binary (recorded, not hashed).
	Build string
	// Hook, if set, is called at named points of the protocol; tests use it
	// to kill a writer at each of them.
	Hook func(point string)
	// Adopt, if set, decides which row receipts of earlier attempts a
	// resuming writer keeps: a receipt whose row keys it rejects is
	// skipped and its rows are redone. A stage writing several versions in
	// lockstep uses it to keep only the shards every version received.
	Adopt func(rowKeys []string) bool
	// LatestIf, if set, decides whether Commit moves the latest pointer to
	// this version: it is called with the pointer as it stands (nil when
	// there is none or it is malformed) inside the compare-and-swap loop,
	// again after every conflict, and the pointer moves only if it returns
	// true. A stage whose versions are ordered (kiln-sync's weights
	// numbers) uses it so the pointer only moves forward. Returning false
	// leaves the pointer as it is, and Commit still succeeds.
	LatestIf func(ctx context.Context, cur *Latest) (bool, error)
}

// Hook points.
const (
	HookShardPartial  = "shard-partial" // the store has received part of a shard
	HookShardWritten  = "shard-written"
	HookRowsReceipted = "rows-receipted"
	HookPartReceipted = "part-receipted"
	HookBeforeCommit  = "before-commit"
	HookBeforeLatest  = "before-latest" // committed (or found committed), latest not yet moved
)

// Writer writes one part of one version. It is not safe for concurrent use.
type Writer struct {
	st      store.Store
	spec    Spec
	version string
	attempt string
	dir     string

	existing *Version // set if the version was already committed
	partDone bool     // this part was already receipted by an earlier attempt
	done     map[string]bool
	shards   []Shard
	seq      int
}

// NewWriter prepares a writer. It computes the version id and looks for
// earlier work: if the version is already committed, Existing returns it and
// nothing needs to be written; if this part was already finished, Commit
// completes the version without writing; otherwise rows receipted by earlier
// attempts of this part are reported by Done and kept.
func NewWriter(ctx context.Context, st store.Store, spec Spec) (*Writer, error) {
	if err := CheckName(spec.Name); err != nil {
		return nil, err
	}
	if spec.Kind.Name == "" {
		return nil, fmt.Errorf("dataset %s: no record kind", spec.Name)
	}
	if spec.Part.count() > 1 {
		for _, in := range spec.Identity.Inputs {
			if !in.Pinned() {
				return nil, fmt.Errorf("input %q is not pinned: a sharded run (--shard %s) needs name@version inputs so every part reads the same data; resolve it with `kiln ls %s`", in.Name, spec.Part, in.Name)
			}
		}
	}
	version, err := spec.Identity.Version()
	if err != nil {
		return nil, fmt.Errorf("dataset %s: %w", spec.Name, err)
	}
	if err := checkKind(ctx, st, spec.Name, spec.Kind.Name); err != nil {
		return nil, err
	}
	w := &Writer{st: st, spec: spec, version: version, attempt: newAttempt(), dir: versionDir(spec.Name, version), done: map[string]bool{}}
	v, err := openVersion(ctx, st, spec.Name, version)
	switch {
	case err == nil:
		w.existing = v
		return w, nil
	case !errors.Is(err, ErrNotFound):
		return nil, err
	}
	if _, err := st.Stat(ctx, w.partKey()); err == nil {
		w.partDone = true
		return w, nil
	} else if !errors.Is(err, store.ErrNotExist) {
		return nil, err
	}
	if err := w.resume(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// checkKind refuses to write a version of kind under name when name
// already holds another kind: its latest version's (the newest committed,
// for a dataset without a pointer). A bare name must mean one kind, or
// every stage reading it fails on a later version, far from the mistake
// (kiln advantages --out onto a trajectories dataset). A name with no
// committed version, or a pointer on a version that is gone, takes any.
func checkKind(ctx context.Context, st store.Store, name, kind string) error {
	version, err := Resolve(ctx, st, name)
	if errors.Is(err, ErrCorrupt) {
		// A malformed pointer is replaced by the move after the commit.
		version, err = Newest(ctx, st, name)
	}
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("dataset %s: checking the record kind it holds: %w", name, err)
	}
	data, _, err := store.ReadAll(ctx, st, manifestKey(name, version))
	if errors.Is(err, store.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("dataset %s: checking the record kind it holds: %w", name, err)
	}
	var m struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("dataset %s@%s: manifest is not valid JSON: %w: %w", name, version, err, ErrCorrupt)
	}
	if m.Kind != kind {
		return fmt.Errorf("dataset %s holds %s (%s@%s), and this command writes %s: name another dataset (--out) for the %s: %w",
			name, m.Kind, name, version, kind, kind, ErrKindMismatch)
	}
	return nil
}

func newAttempt() string {
	var b [4]byte
	rand.Read(b[:])
	return strconv.FormatInt(time.Now().Unix(), 36) + hex.EncodeToString(b[:])
}

// Ref is the reference of the version being written.
func (w *Writer) Ref() Ref { return Ref{Name: w.spec.Name, Version: w.version} }

// Existing is the committed version, if it existed when the writer started.
func (w *Writer) Existing() *Version { return w.existing }

// PartDone reports whether this part was finished by an earlier attempt.
func (w *Writer) PartDone() bool { return w.partDone }

// Done reports whether an earlier attempt of this part already wrote the row
// with this key (see WriteShard's rowKeys).
func (w *Writer) Done(rowKey string) bool { return w.done[rowKey] }

// Resumed is the number of rows kept from earlier attempts.
func (w *Writer) Resumed() int { return len(w.done) }

func (w *Writer) partKey() string {
	return w.dir + fmt.Sprintf("parts/%05d-of-%05d.json", w.spec.Part.Index, w.spec.Part.count())
}

func (w *Writer) hook(point string) {
	if w.spec.Hook != nil {
		w.spec.Hook(point)
	}
}

// rowReceipt records that a shard holds the rows with these keys.
type rowReceipt struct {
	Shard   Shard    `json:"shard"`
	RowKeys []string `json:"row_keys"`
}

// resume adopts shards receipted by earlier attempts of this part. Receipts
// are taken in key order (attempt, then sequence); one whose rows overlap an
// adopted receipt, or whose shard is gone, is skipped and its rows redone.
func (w *Writer) resume(ctx context.Context) error {
	prefix := w.dir + fmt.Sprintf("rows/p%05d/", w.spec.Part.Index)
	var keys []string
	if err := w.st.List(ctx, prefix, func(info store.Info) error {
		keys = append(keys, info.Key)
		return nil
	}); err != nil {
		return err
	}
	sort.Strings(keys)
	for _, key := range keys {
		data, _, err := store.ReadAll(ctx, w.st, key)
		if err != nil {
			continue
		}
		var rr rowReceipt
		if json.Unmarshal(data, &rr) != nil {
			continue
		}
		overlap := false
		for _, k := range rr.RowKeys {
			overlap = overlap || w.done[k]
		}
		if overlap || (w.spec.Adopt != nil && !w.spec.Adopt(rr.RowKeys)) {
			continue
		}
		if info, err := w.st.Stat(ctx, w.dir+rr.Shard.Key); err != nil || info.Size != rr.Shard.Bytes {
			continue
		}
		for _, k := range rr.RowKeys {
			w.done[k] = true
		}
		w.shards = append(w.shards, rr.Shard)
	}
	return nil
}

// WriteShard writes one shard of rows records, produced by encode. If
// rowKeys is non-nil it names the input rows the shard holds, and a row
// receipt is written after the shard so a rerun resumes after them.
func (w *Writer) WriteShard(ctx context.Context, rows int64, rowKeys []string, encode func(io.Writer) error) (Shard, error) {
	if w.existing != nil || w.partDone {
		return Shard{}, fmt.Errorf("dataset %s: part %s is already written", w.Ref(), w.spec.Part)
	}
	name := fmt.Sprintf("shards/p%05d-%s-%05d%s", w.spec.Part.Index, w.attempt, w.seq, w.spec.Kind.Ext)
	w.seq++
	s, err := w.putShard(ctx, name, encode)
	if err != nil {
		return Shard{}, fmt.Errorf("dataset %s: writing shard %q: %w", w.Ref(), name, err)
	}
	s.Rows = rows
	w.hook(HookShardWritten)
	if rowKeys != nil {
		b, _ := json.Marshal(rowReceipt{Shard: s, RowKeys: rowKeys})
		key := w.dir + fmt.Sprintf("rows/p%05d/%s-%05d.json", w.spec.Part.Index, w.attempt, w.seq-1)
		if _, err := w.st.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
			return Shard{}, fmt.Errorf("dataset %s: writing row receipt: %w", w.Ref(), err)
		}
		w.hook(HookRowsReceipted)
	}
	w.shards = append(w.shards, s)
	return s, nil
}

// errStoreStopped is what the encoder of a shard sees when the store's Put
// returned before reading the whole shard.
var errStoreStopped = errors.New("the store stopped reading")

// putShard streams encode's output to the store while hashing it.
func (w *Writer) putShard(ctx context.Context, name string, encode func(io.Writer) error) (Shard, error) {
	pr, pw := io.Pipe()
	h := sha256.New()
	cw := &countWriter{w: pw, h: h, first: func() { w.hook(HookShardPartial) }}
	var encErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		encErr = encode(cw)
		pw.CloseWithError(encErr)
	}()
	_, err := w.st.Put(ctx, w.dir+name, pr, -1)
	pr.CloseWithError(errStoreStopped)
	wg.Wait()
	switch {
	case encErr != nil && !errors.Is(encErr, errStoreStopped):
		// The encoder failed (Put then failed with its error, read through
		// the pipe): that error is the one to report.
		w.st.Delete(context.WithoutCancel(ctx), w.dir+name)
		return Shard{}, encErr
	case err != nil:
		// The store failed (no space, permission denied, not a
		// directory, ...); the encoder only saw the pipe close. Report
		// the store's error, not the pipe's.
		w.st.Delete(context.WithoutCancel(ctx), w.dir+name)
		return Shard{}, fmt.Errorf("store %s: %w", w.st.URI(), err)
	case encErr != nil:
		w.st.Delete(context.WithoutCancel(ctx), w.dir+name)
		return Shard{}, fmt.Errorf("store %s: %w before the end of the shard", w.st.URI(), encErr)
	}
	return Shard{Key: name, Part: w.spec.Part.Index, Bytes: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

type countWriter struct {
	w     io.Writer
	h     hash.Hash
	n     int64
	first func() // called once, after the first bytes reached the store
}

func (c *countWriter) Write(p []byte) (int, error) {
	c.h.Write(p)
	n, err := c.w.Write(p)
	c.n += int64(n)
	if c.first != nil && c.n > 0 {
		c.first()
		c.first = nil
	}
	return n, err
}

// partReceipt is the record of one finished part.
type partReceipt struct {
	Part     int            `json:"part"`
	Parts    int            `json:"parts"`
	Attempt  string         `json:"attempt"`
	Host     string         `json:"host"`
	Shards   []Shard        `json:"shards"`
	Metrics  map[string]any `json:"metrics,omitempty"`
	Finished time.Time      `json:"finished"`
}

// Result is the outcome of Commit.
type Result struct {
	Ref Ref
	// Committed: this call wrote the manifest. False when another process
	// committed the same version first (Version then holds theirs), or when
	// Pending.
	Committed bool
	// Pending: this part is receipted but others are not yet; the last part
	// to finish commits.
	Pending bool
	// Existed: the version was already committed when the writer started,
	// so nothing was written but the latest pointer.
	Existed bool
	Version *Version
	// Latest is the dataset's latest pointer after the move (nil when
	// Pending).
	Latest *Latest
}

// Commit finishes this part and, if every part is now finished, commits the
// version. Exactly one process commits a version; the others get the
// committed version back. Then, whoever committed it and also when it was
// committed already (a rerun, a late part), it moves the dataset's latest
// pointer to the version (MoveLatest); an error there leaves the version
// committed and the pointer where it was, and a rerun moves it. metrics are
// stage metrics for this part (numbers are summed across parts).
func (w *Writer) Commit(ctx context.Context, metrics map[string]any) (Result, error) {
	ref := w.Ref()
	if w.existing != nil {
		return w.moveLatest(ctx, Result{Ref: ref, Existed: true, Version: w.existing})
	}
	host, _ := os.Hostname()
	if !w.partDone {
		sort.Slice(w.shards, func(i, j int) bool { return w.shards[i].Key < w.shards[j].Key })
		pr := partReceipt{Part: w.spec.Part.Index, Parts: w.spec.Part.count(), Attempt: w.attempt, Host: host,
			Shards: w.shards, Metrics: metrics, Finished: time.Now().UTC()}
		if pr.Shards == nil {
			pr.Shards = []Shard{}
		}
		b, _ := json.MarshalIndent(pr, "", " ")
		_, err := w.st.PutIfAbsent(ctx, w.partKey(), bytes.NewReader(b), int64(len(b)))
		if errors.Is(err, store.ErrExist) {
			// A concurrent attempt of this part finished first; ours is
			// redundant. Our shards are left to GC: the winner may have
			// adopted some of them through their row receipts.
			w.shards = nil
		} else if err != nil {
			return Result{}, fmt.Errorf("dataset %s: writing receipt of part %s: %w", ref, w.spec.Part, err)
		}
		w.hook(HookPartReceipted)
	}
	receipts, err := w.partReceipts(ctx)
	if err != nil {
		return Result{}, err
	}
	if len(receipts) < w.spec.Part.count() {
		return Result{Ref: ref, Pending: true}, nil
	}
	m, err := w.manifest(ctx, receipts, host)
	if err != nil {
		return Result{}, err
	}
	b, _ := json.MarshalIndent(m, "", " ")
	w.hook(HookBeforeCommit)
	_, err = w.st.PutIfAbsent(ctx, manifestKey(ref.Name, ref.Version), bytes.NewReader(b), int64(len(b)))
	committed := err == nil
	if err != nil && !errors.Is(err, store.ErrExist) {
		return Result{}, fmt.Errorf("dataset %s: writing manifest: %w", ref, err)
	}
	v, err := openVersion(ctx, w.st, ref.Name, ref.Version)
	if err != nil {
		return Result{}, err
	}
	return w.moveLatest(ctx, Result{Ref: ref, Committed: committed, Version: v})
}

// moveLatest moves the latest pointer to the committed res.Ref.
func (w *Writer) moveLatest(ctx context.Context, res Result) (Result, error) {
	w.hook(HookBeforeLatest)
	// res.Version was just read from its manifest: the version is committed.
	l, err := moveLatest(ctx, w.st, res.Ref, ThisProcess(w.spec.Identity.Stage), w.spec.LatestIf)
	if err != nil {
		return Result{}, fmt.Errorf("dataset %s is committed, but its latest pointer was not moved (rerun to move it): %w", res.Ref, err)
	}
	res.Latest = l
	return res, nil
}

// partReceipts reads the receipts of every part of this version's split.
func (w *Writer) partReceipts(ctx context.Context) ([]partReceipt, error) {
	n := w.spec.Part.count()
	suffix := fmt.Sprintf("-of-%05d.json", n)
	var keys []string
	if err := w.st.List(ctx, w.dir+"parts/", func(info store.Info) error {
		if strings.HasSuffix(info.Key, suffix) {
			keys = append(keys, info.Key)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dataset %s: listing part receipts: %w", w.Ref(), err)
	}
	if len(keys) < n {
		return nil, nil
	}
	sort.Strings(keys)
	var out []partReceipt
	for _, key := range keys {
		data, _, err := store.ReadAll(ctx, w.st, key)
		if err != nil {
			return nil, fmt.Errorf("dataset %s: reading part receipt: %w", w.Ref(), err)
		}
		var pr partReceipt
		if err := json.Unmarshal(data, &pr); err != nil || pr.Parts != n || pr.Part < 0 || pr.Part >= n {
			return nil, fmt.Errorf("dataset %s: part receipt %q is malformed: %w", w.Ref(), key, ErrCorrupt)
		}
		out = append(out, pr)
	}
	return out, nil
}

// manifest assembles the commit record from the part receipts, checking
// that every shard they name is present with the recorded size (GC may have
// removed shards of a version left uncommitted past its grace period).
func (w *Writer) manifest(ctx context.Context, receipts []partReceipt, host string) (*Manifest, error) {
	ref := w.Ref()
	inputs := w.spec.Identity.Inputs
	if inputs == nil {
		inputs = []Ref{}
	}
	external := w.spec.Identity.External
	if external == nil {
		external = []External{}
	}
	m := &Manifest{
		Format: ManifestFormat, Dataset: ref.Name, Version: ref.Version,
		Kind: w.spec.Kind.Name, Encoding: w.spec.Kind.Encoding, Schema: w.spec.Kind.Fingerprint(),
		Shards: []Shard{}, Parts: w.spec.Part.count(),
		Producer: Producer{Stage: w.spec.Identity.Stage, CodeVersion: w.spec.Identity.CodeVersion,
			Build: w.spec.Build, Args: w.spec.Identity.Args, Host: host},
		Inputs: inputs, External: external, Created: time.Now().UTC(),
	}
	for _, pr := range receipts {
		for _, s := range pr.Shards {
			info, err := w.st.Stat(ctx, w.dir+s.Key)
			if err != nil || info.Size != s.Bytes {
				// The receipt can never be committed; removing it lets a
				// rerun of that part redo the work.
				w.st.Delete(ctx, w.dir+fmt.Sprintf("parts/%05d-of-%05d.json", pr.Part, pr.Parts))
				return nil, fmt.Errorf("dataset %s: shard %q of part %d is missing or damaged (%v): rerun part %d/%d: %w",
					ref, s.Key, pr.Part, err, pr.Part, pr.Parts, ErrCorrupt)
			}
			m.Shards = append(m.Shards, s)
			m.Rows += s.Rows
			m.Bytes += s.Bytes
		}
		m.Metrics = mergeMetrics(m.Metrics, pr.Metrics)
	}
	return m, nil
}

func mergeMetrics(into, from map[string]any) map[string]any {
	if len(from) == 0 {
		return into
	}
	if into == nil {
		into = map[string]any{}
	}
	for k, v := range from {
		a, aok := into[k].(float64)
		b, bok := toFloat(v)
		switch {
		case aok && bok:
			into[k] = a + b
		case bok && into[k] == nil:
			into[k] = b
		case into[k] == nil:
			into[k] = v
		}
	}
	return into
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	}
	return 0, false
}
