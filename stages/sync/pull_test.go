package sync

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	gosync "sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/formats/store/storetest"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/sync/synctest"
)

// fixture is a store and a captured environment for pull tests.
type fixture struct {
	t    *testing.T
	st   store.Store
	env  *stagecmd.Env
	out  *bytes.Buffer
	name string
}

// eachStore runs fn on a local store and on versitygw's S3.
func eachStore(t *testing.T, fn func(t *testing.T, f *fixture)) {
	t.Run("local", func(t *testing.T) {
		st, err := store.Open(t.TempDir())
		require.NoError(t, err)
		fn(t, newFixture(t, st))
	})
	t.Run("s3", func(t *testing.T) {
		fn(t, newFixture(t, storetest.StartVersity(t)))
	})
}

func newFixture(t *testing.T, st store.Store) *fixture {
	var out, errb bytes.Buffer
	env := &stagecmd.Env{Stdout: &out, Stderr: &errb, Log: stagecmd.NewLogger(&errb, false)}
	return &fixture{t: t, st: st, env: env, out: &out, name: "weights/tiny"}
}

// pubOpts are the publish options a test varies.
type pubOpts struct {
	full     bool
	encoding string // "" (auto), xor, overwrite
	baseDir  string
}

// publish writes ck into a directory and publishes it as a version of
// f.name; it returns the committed reference and the files an engine
// loads (what a pull must reproduce).
func (f *fixture) publish(ck *synctest.Model, o pubOpts) (dataset.Ref, map[string][]byte) {
	f.t.Helper()
	dir := f.t.TempDir()
	require.NoError(f.t, ck.Write(dir))
	res, err := Publish(context.Background(), f.env, f.st, stagecmd.Output{Name: f.name},
		PublishOptions{Checkpoint: dir, Full: o.full, FullEvery: DefaultFullEvery, BaseDir: o.baseDir, Encoding: o.encoding})
	require.NoError(f.t, err)
	return res.Ref, engineFiles(f.t, ck, dir)
}

// engineFiles reads the files of ck's engine files written in dir.
func engineFiles(t *testing.T, ck *synctest.Model, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, name := range ck.EngineFiles() {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		out[name] = b
	}
	return out
}

// mutate changes a few bytes (about 1 in 16) of ceil(fraction × tensors)
// tensors of m chosen by seed, as an optimizer step does, and returns
// their names; shapes, dtypes and other files stay.
func mutate(m *synctest.Model, fraction float64, seed uint64) []string {
	r := rand.New(rand.NewPCG(seed, 7))
	names := m.Names()
	k := min(len(names), int(math.Ceil(fraction*float64(len(names)))))
	var out []string
	for _, i := range r.Perm(len(names))[:k] {
		t := m.Tensor(names[i])
		for j := 0; j < max(1, len(t.Data)/16); j++ {
			t.Data[r.IntN(len(t.Data))] ^= byte(1 + r.IntN(255))
		}
		out = append(out, names[i])
	}
	sort.Strings(out)
	return out
}

func (f *fixture) pull(ref dataset.Ref, dir string) (PullResult, error) {
	return Pull(context.Background(), f.env, f.st, ref, dir, PullOptions{ChunkSize: 1000, Workers: 3})
}

func (f *fixture) open(ref dataset.Ref) *weightsVersion {
	f.t.Helper()
	w, err := openWeights(context.Background(), f.st, ref)
	require.NoError(f.t, err)
	return w
}

// dirFiles reads every regular file under dir (relative path -> bytes),
// failing on anything that is not a plain file or directory.
func dirFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file (%s)", path, d.Type())
		}
		rel, _ := filepath.Rel(dir, path)
		b, err := os.ReadFile(path)
		out[filepath.ToSlash(rel)] = b
		return err
	}))
	return out
}

// requireSameFiles checks the directory got holds exactly the files w,
// bit for bit.
func requireSameFiles(t *testing.T, w map[string][]byte, got string) {
	t.Helper()
	g := dirFiles(t, got)
	require.Equal(t, sortedNames(w), sortedNames(g), "the same files")
	for name, b := range w {
		require.True(t, bytes.Equal(b, g[name]), "file %q differs from the publisher's", name)
	}
}

func sortedNames(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// requireHeld checks dir's state, current and held directory name ref,
// and that the held directory holds the files of ckDir.
func requireHeld(t *testing.T, dir string, ref dataset.Ref, want map[string][]byte) {
	t.Helper()
	s, md, err := heldVersion(dir)
	require.NoError(t, err)
	require.NotNil(t, s, "a state")
	require.Equal(t, ref.Version, s.Version, "state.json names %s", ref)
	cur, err := os.Readlink(filepath.Join(dir, currentLink))
	require.NoError(t, err)
	require.Equal(t, s.Dir, cur, "current points at the held version")
	if want != nil {
		requireSameFiles(t, want, md)
	}
	staging, _ := filepath.Glob(filepath.Join(dir, stagingPrefix+"*"))
	assert.Empty(t, staging, "no staging directory left")
}

func exitCode(err error) int { return stagecmd.ExitCode(err) }

// TestPullReconstructsDeltas (sync spec §5.1 item 5): a full version, then
// replace, xor and overwrite deltas; each pull reproduces the publisher's
// files bit for bit, applying onto the held version; a fresh directory
// pulling the last one replays the whole chain from the full version.
func TestPullReconstructsDeltas(t *testing.T) {
	eachStore(t, func(t *testing.T, f *fixture) {
		ck := synctest.Tiny(1, 3, (16+3-1)/3, 512)
		dir := t.TempDir()
		v1, ck1 := f.publish(ck, pubOpts{})
		require.True(t, f.open(v1).Full)
		r, err := f.pull(v1, dir)
		require.NoError(t, err)
		assert.False(t, r.SeedHeld)
		assert.Equal(t, filepath.Join(dir, versionDirName(1, v1.Version)), r.ModelDir)
		requireHeld(t, dir, v1, ck1)

		prev, prevDir := v1, r.ModelDir
		for i, enc := range []string{records.EncReplace, records.EncXOR, records.EncOverwrite} {
			changed := mutate(ck, 0.25, uint64(10+i))
			require.NotEmpty(t, changed)
			o := pubOpts{}
			switch enc {
			case records.EncXOR:
				o.baseDir = dir
			case records.EncOverwrite:
				o.baseDir, o.encoding = dir, records.EncOverwrite
			}
			ref, ckDir := f.publish(ck, o)
			w := f.open(ref)
			require.False(t, w.Full, "a delta: %s", w.FullReason)
			require.Equal(t, prev.Version, w.Base)
			var encs []string
			for _, e := range w.Entries {
				if e.Entry == records.EntryTensor && e.Encoding != records.EncUnchanged {
					encs = append(encs, e.Encoding)
					assert.Contains(t, changed, e.Name)
				}
			}
			require.Len(t, encs, len(changed), "%s: only the changed tensors are stored", enc)
			for _, e := range encs {
				require.Equal(t, enc, e)
			}
			heldBefore := dirFiles(t, prevDir)
			r, err := f.pull(ref, dir)
			require.NoError(t, err)
			assert.True(t, r.SeedHeld, "applied onto the held version")
			assert.Equal(t, 1, r.Deltas)
			assert.Equal(t, len(changed), r.Patched)
			requireHeld(t, dir, ref, ckDir)
			// The held version was never written, and stays (an engine may
			// still serve it) until the next switch.
			assert.Equal(t, heldBefore, dirFiles(t, prevDir), "the previous version's files are untouched")
			prev, prevDir = ref, r.ModelDir
		}
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		var versions []string
		for _, e := range ents {
			if versionNumber(e.Name()) > 0 {
				versions = append(versions, e.Name())
			}
		}
		assert.Len(t, versions, 2, "older versions than the one held before are deleted: %v", versions)

		fresh := t.TempDir()
		r, err = f.pull(prev, fresh)
		require.NoError(t, err)
		assert.Equal(t, v1.String(), r.Seed, "a fresh directory starts at the full version")
		assert.Equal(t, 3, r.Deltas)
		requireSameFiles(t, dirFiles(t, prevDir), r.ModelDir)
	})
}

// TestPullResetsAtFull (item 7): v1 delta-less full, v2 full, v3 delta on
// v2: a reader at v1 pulling v3 resets from v2; a fresh reader seeds from
// v2 too; a version missing from the chain is exit 3 naming it.
func TestPullResetsAtFull(t *testing.T) {
	eachStore(t, func(t *testing.T, f *fixture) {
		ck := synctest.Tiny(2, 2, (8+2-1)/2, 512)
		v0, _ := f.publish(ck, pubOpts{})
		mutate(ck, 0.5, 1)
		v1, _ := f.publish(ck, pubOpts{})
		require.False(t, f.open(v1).Full)
		mutate(ck, 0.5, 2)
		v2, _ := f.publish(ck, pubOpts{full: true})
		require.True(t, f.open(v2).Full)
		mutate(ck, 0.5, 3)
		v3, ck3 := f.publish(ck, pubOpts{})
		require.Equal(t, v2.Version, f.open(v3).Base)

		dir := t.TempDir()
		_, err := f.pull(v1, dir)
		require.NoError(t, err)
		r, err := f.pull(v3, dir)
		require.NoError(t, err)
		assert.False(t, r.SeedHeld, "v1 is not in v3's chain")
		assert.Equal(t, v2.String(), r.Seed)
		assert.Equal(t, 1, r.Deltas)
		requireHeld(t, dir, v3, ck3)

		fresh := t.TempDir()
		r, err = f.pull(v3, fresh)
		require.NoError(t, err)
		assert.Equal(t, v2.String(), r.Seed, "the newest full version at or below the target")
		requireHeld(t, fresh, v3, ck3)

		// v1's base v0 disappears: a reader pulling v1 fails, naming it.
		require.NoError(t, f.st.Delete(context.Background(), v0.Name+"/_v/"+v0.Version+"/manifest.json"))
		_, err = f.pull(v1, t.TempDir())
		require.Error(t, err)
		assert.Equal(t, stagecmd.ExitNotFound, exitCode(err), "%v", err)
		assert.Contains(t, err.Error(), v0.Version)
	})
}

// TestPullAlreadyHeld (item 6, already applied): a pull of the held
// version does nothing, and says so.
func TestPullAlreadyHeld(t *testing.T) {
	st, err := store.Open(t.TempDir())
	require.NoError(t, err)
	f := newFixture(t, st)
	ck := synctest.Tiny(3, 2, 4, 512)
	v1, ck1 := f.publish(ck, pubOpts{})
	dir := t.TempDir()
	r1, err := f.pull(v1, dir)
	require.NoError(t, err)
	state1, err := os.ReadFile(filepath.Join(dir, stateFile))
	require.NoError(t, err)
	fi1, err := os.Stat(filepath.Join(r1.ModelDir, "config.json"))
	require.NoError(t, err)
	r2, err := f.pull(v1, dir)
	require.NoError(t, err)
	assert.True(t, r2.AlreadyHeld)
	assert.Equal(t, r1.ModelDir, r2.ModelDir)
	state2, err := os.ReadFile(filepath.Join(dir, stateFile))
	require.NoError(t, err)
	assert.Equal(t, state1, state2)
	fi2, err := os.Stat(filepath.Join(r2.ModelDir, "config.json"))
	require.NoError(t, err)
	assert.True(t, os.SameFile(fi1, fi2), "the held files were not replaced")
	requireHeld(t, dir, v1, ck1)
}

// requireUntouched checks a failed pull left dir as it was: state, current,
// the held directory's bytes, and no staging.
func requireUntouched(t *testing.T, dir string, before map[string][]byte, held dataset.Ref) {
	t.Helper()
	s, md, err := heldVersion(dir)
	require.NoError(t, err)
	require.Equal(t, held.Version, s.Version, "state not advanced")
	cur, err := os.Readlink(filepath.Join(dir, currentLink))
	require.NoError(t, err)
	require.Equal(t, s.Dir, cur)
	require.Equal(t, before, dirFiles(t, md), "the held version's bytes unchanged")
	staging, _ := filepath.Glob(filepath.Join(dir, stagingPrefix+"*"))
	require.Empty(t, staging)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		require.LessOrEqual(t, versionNumber(e.Name()), s.Number, "no newer version directory in place: %s", e.Name())
	}
}

// TestPullCorruptPayload (item 8): a byte flipped in a pack payload in the
// store is exit 4 naming the tensor; the state is not advanced.
func TestPullCorruptPayload(t *testing.T) {
	eachStore(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		ck := synctest.Tiny(4, 2, (10+1)/2, 512)
		v1, _ := f.publish(ck, pubOpts{})
		dir := t.TempDir()
		_, err := f.pull(v1, dir)
		require.NoError(t, err)
		changed := mutate(ck, 0.3, 7)
		v2, _ := f.publish(ck, pubOpts{baseDir: dir})
		var victim records.WeightsEntry
		for _, e := range f.open(v2).Entries {
			if e.Entry == records.EntryTensor && e.Encoding != records.EncUnchanged {
				victim = e
				break
			}
		}
		require.Contains(t, changed, victim.Name)
		key := dataset.AttachmentKey(v2, victim.Payload)
		pack, _, err := store.ReadAll(ctx, f.st, key)
		require.NoError(t, err)
		pack[victim.PayloadOffset+victim.PayloadSize/2] ^= 0x5a
		_, err = f.st.Put(ctx, key, bytes.NewReader(pack), int64(len(pack)))
		require.NoError(t, err)

		_, md, _ := heldVersion(dir)
		before := dirFiles(t, md)
		_, err = f.pull(v2, dir)
		require.Error(t, err)
		assert.Equal(t, stagecmd.ExitCorrupt, exitCode(err), "%v", err)
		assert.Contains(t, err.Error(), victim.Name, "names the tensor")
		requireUntouched(t, dir, before, v1)
	})
}

// TestPullWrongBase (item 6): a held copy whose bytes are not its
// version's (a wrong base) refuses an xor or overwrite delta, naming the
// tensor, and leaves state and bytes unchanged; a delta applied on a
// version other than its base, or out of order, is refused before any
// byte is read.
func TestPullWrongBase(t *testing.T) {
	st, err := store.Open(t.TempDir())
	require.NoError(t, err)
	f := newFixture(t, st)
	ck := synctest.Tiny(5, 2, (8+1)/2, 512)
	v1, _ := f.publish(ck, pubOpts{})
	dir := t.TempDir()
	_, err = f.pull(v1, dir)
	require.NoError(t, err)
	changed := mutate(ck, 0.5, 8)
	v2, _ := f.publish(ck, pubOpts{baseDir: dir})
	mutate(ck, 0.5, 9)
	v3, _ := f.publish(ck, pubOpts{baseDir: dir, encoding: records.EncOverwrite})

	// The held copy of v1 is changed under kiln's feet in a tensor v2
	// patches.
	_, md, err := heldVersion(dir)
	require.NoError(t, err)
	w1 := f.open(v1)
	victim := w1.tensors()[changed[0]]
	path := filepath.Join(md, victim.File)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[victim.Offset] ^= 1
	require.NoError(t, os.WriteFile(path, b, 0o644))
	before := dirFiles(t, md)
	_, err = f.pull(v2, dir)
	require.Error(t, err)
	assert.Equal(t, stagecmd.ExitCorrupt, exitCode(err), "%v", err)
	assert.Contains(t, err.Error(), victim.Name)
	assert.Contains(t, err.Error(), "base bytes")
	requireUntouched(t, dir, before, v1)

	// Out of order: v3 (a delta on v2) on v1's bytes.
	p := &puller{ctx: context.Background(), st: st, env: f.env, dir: dir, staging: t.TempDir(), o: PullOptions{Workers: 1}}
	c, err := newCodec()
	require.NoError(t, err)
	defer c.Close()
	_, err = p.applyDelta(c, w1, f.open(v3))
	require.Error(t, err)
	assert.Equal(t, stagecmd.ExitCorrupt, exitCode(err))
	assert.Contains(t, err.Error(), "does not apply")
}

// TestPullStaleShard (item 11): a shard no row names in the held directory
// is not carried into the new version; an indexed shard missing from the
// held directory fails the pull naming it.
func TestPullStaleShard(t *testing.T) {
	st, err := store.Open(t.TempDir())
	require.NoError(t, err)
	f := newFixture(t, st)
	ck := synctest.Tiny(6, 3, (9+3-1)/3, 512)
	v1, _ := f.publish(ck, pubOpts{})
	dir := t.TempDir()
	r1, err := f.pull(v1, dir)
	require.NoError(t, err)
	mutate(ck, 0.4, 10)
	v2, ck2 := f.publish(ck, pubOpts{baseDir: dir})

	// A stale shard with conflicting data (the old shard 1 under another
	// name, as a trainer's older save would leave).
	stale := filepath.Join(r1.ModelDir, "model-00002-of-00004.safetensors")
	b, err := os.ReadFile(filepath.Join(r1.ModelDir, ck.ShardName(1)))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(stale, b, 0o644))
	r2, err := f.pull(v2, dir)
	require.NoError(t, err)
	requireHeld(t, dir, v2, ck2)
	_, err = os.Stat(filepath.Join(r2.ModelDir, filepath.Base(stale)))
	assert.ErrorIs(t, err, fs.ErrNotExist, "the stale shard is not copied")

	// A missing indexed shard.
	mutate(ck, 0.4, 11)
	v3, _ := f.publish(ck, pubOpts{baseDir: dir})
	require.NoError(t, os.Remove(filepath.Join(r2.ModelDir, ck.ShardName(2))))
	before := dirFiles(t, r2.ModelDir)
	_, err = f.pull(v3, dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), ck.ShardName(2))
	assert.Equal(t, stagecmd.ExitCorrupt, exitCode(err), "%v", err)
	requireUntouched(t, dir, before, v2)
}

// TestPulledDirIsPlain (item 14): what an engine is handed is a POSIX
// directory of complete regular files, the index naming shards that are
// there, reachable through current too.
func TestPulledDirIsPlain(t *testing.T) {
	st, err := store.Open(t.TempDir())
	require.NoError(t, err)
	f := newFixture(t, st)
	ck := synctest.Tiny(12, 2, (6+2-1)/2, 512)
	v1, _ := f.publish(ck, pubOpts{})
	dir := t.TempDir()
	r, err := f.pull(v1, dir)
	require.NoError(t, err)
	fi, err := os.Lstat(r.ModelDir)
	require.NoError(t, err)
	require.True(t, fi.IsDir(), "a real directory, not a link")
	files := dirFiles(t, r.ModelDir) // fails on anything but regular files
	for _, e := range f.open(v1).Entries {
		if e.Entry == records.EntryFile {
			sum := sha256.Sum256(files[e.Name])
			assert.Equal(t, e.Checksum, hex.EncodeToString(sum[:]), e.Name)
			assert.Equal(t, e.Size, int64(len(files[e.Name])))
		}
	}
	assert.Contains(t, string(files["model.safetensors.index.json"]), ck.ShardName(1))
	resolved, err := filepath.EvalSymlinks(filepath.Join(dir, currentLink))
	require.NoError(t, err)
	assert.Equal(t, r.ModelDir, resolved)
}

// TestPullUnwritable: a --to the process cannot write is exit 1 naming it;
// a --to that is a file is a usage error.
func TestPullUnwritable(t *testing.T) {
	st, err := store.Open(t.TempDir())
	require.NoError(t, err)
	f := newFixture(t, st)
	v1, _ := f.publish(synctest.Tiny(13, 2, 4, 512), pubOpts{})
	var to string
	if os.Geteuid() == 0 {
		to = "/sys/kiln-sync-test/weights" // even root cannot create there
	} else {
		ro := t.TempDir()
		require.NoError(t, os.Chmod(ro, 0o555))
		to = filepath.Join(ro, "weights")
	}
	_, err = f.pull(v1, to)
	require.Error(t, err)
	assert.Equal(t, stagecmd.ExitFailure, exitCode(err), "%v", err)
	assert.Contains(t, err.Error(), to)
	assert.Contains(t, err.Error(), "cannot write")

	file := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err = f.pull(v1, file)
	assert.Equal(t, stagecmd.ExitUsage, exitCode(err), "%v", err)
}

// TestConcurrentPullsRacingPublish: 100 pulls of the latest version into
// 10 directories (10 each: the flock makes them take turns) while new
// versions are published only ever see complete versions: each result is
// one published version's files exactly, and the directory's state names
// a version whose files are there whole.
func TestConcurrentPullsRacingPublish(t *testing.T) {
	st, err := store.Open(t.TempDir())
	require.NoError(t, err)
	f := newFixture(t, st)
	ck := synctest.Tiny(14, 2, (8+2-1)/2, 512)
	published := map[string]map[string][]byte{} // version -> files
	var mu gosync.Mutex
	v1, files1 := f.publish(ck, pubOpts{})
	published[v1.Version] = files1

	dirs := make([]string, 10)
	for i := range dirs {
		dirs[i] = t.TempDir()
	}
	ctx := context.Background()
	var wg gosync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			dir := dirs[i%len(dirs)]
			var out bytes.Buffer
			env := &stagecmd.Env{Stdout: &out, Stderr: io.Discard, Log: stagecmd.NewLogger(io.Discard, false)}
			r, err := Pull(ctx, env, st, dataset.Ref{Name: f.name}, dir, PullOptions{Workers: 2})
			if err != nil {
				errs <- fmt.Errorf("pull %d: %w", i, err)
				return
			}
			got := map[string][]byte{}
			err = filepath.WalkDir(r.ModelDir, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				b, err := os.ReadFile(path)
				got[filepath.ToSlash(strings.TrimPrefix(path, r.ModelDir+"/"))] = b
				return err
			})
			if err != nil {
				errs <- fmt.Errorf("pull %d: reading %s: %w", i, r.ModelDir, err)
				return
			}
			mu.Lock()
			want := published[r.Ref.Version]
			mu.Unlock()
			if want == nil {
				errs <- fmt.Errorf("pull %d: %s is not a version the test published", i, r.Ref)
				return
			}
			if len(want) != len(got) {
				errs <- fmt.Errorf("pull %d: %d files, want %d", i, len(got), len(want))
				return
			}
			for name, b := range want {
				if !bytes.Equal(b, got[name]) {
					errs <- fmt.Errorf("pull %d: %s differs from %s's", i, name, r.Ref)
					return
				}
			}
		}(i)
	}
	for k := 0; k < 3; k++ {
		mutate(ck, 0.3, uint64(100+k))
		dir := t.TempDir()
		require.NoError(t, ck.Write(dir))
		files := engineFiles(t, ck, dir)
		// Record before publishing: a pull may see it the moment it commits.
		// Its version id is known first (--print-version's code path).
		var out bytes.Buffer
		env := &stagecmd.Env{Stdout: &out, Stderr: io.Discard, Log: stagecmd.NewLogger(io.Discard, false)}
		res, err := Publish(ctx, env, st, stagecmd.Output{Name: f.name, PrintVersion: true}, PublishOptions{Checkpoint: dir, FullEvery: 16})
		require.NoError(t, err)
		mu.Lock()
		published[res.Ref.Version] = files
		mu.Unlock()
		_, err = Publish(ctx, env, st, stagecmd.Output{Name: f.name}, PublishOptions{Checkpoint: dir, FullEvery: 16})
		require.NoError(t, err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, dir := range dirs {
		s, md, err := heldVersion(dir)
		require.NoError(t, err)
		want := published[s.Version]
		require.NotNil(t, want)
		got := dirFiles(t, md)
		require.Equal(t, len(want), len(got))
		for name, b := range want {
			require.True(t, bytes.Equal(b, got[name]), "%s: %s", dir, name)
		}
	}
}

// TestPullHeldFileChanged: a file of the held copy changed under kiln's
// feet outside any tensor a delta patches (here config.json, same size)
// is caught by the final sha256 check of every file: exit 4 naming it,
// state and bytes unchanged.
func TestPullHeldFileChanged(t *testing.T) {
	st, err := store.Open(t.TempDir())
	require.NoError(t, err)
	f := newFixture(t, st)
	ck := synctest.Tiny(15, 2, 3, 512)
	v1, _ := f.publish(ck, pubOpts{})
	dir := t.TempDir()
	r1, err := f.pull(v1, dir)
	require.NoError(t, err)
	mutate(ck, 0.3, 16)
	v2, _ := f.publish(ck, pubOpts{baseDir: dir})
	path := filepath.Join(r1.ModelDir, "config.json")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[len(b)-2] ^= 1
	require.NoError(t, os.WriteFile(path, b, 0o644))
	before := dirFiles(t, r1.ModelDir)
	_, err = f.pull(v2, dir)
	require.Error(t, err)
	assert.Equal(t, stagecmd.ExitCorrupt, exitCode(err), "%v", err)
	assert.Contains(t, err.Error(), "config.json")
	requireUntouched(t, dir, before, v1)
}

// TestPullCorruptStoredFile: a full version's file damaged in the store
// (a byte flipped, or the object cut short) fails the pull with exit 4
// naming the file, checked as it is downloaded, and leaves the held
// version, its state and current as they were.
func TestPullCorruptStoredFile(t *testing.T) {
	eachStore(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		ck := synctest.Tiny(21, 2, 4, 1024)
		v1, _ := f.publish(ck, pubOpts{full: true})
		dir := t.TempDir()
		r1, err := f.pull(v1, dir)
		require.NoError(t, err)
		before := dirFiles(t, r1.ModelDir)
		mutate(ck, 0.3, 22)
		v2, _ := f.publish(ck, pubOpts{full: true})
		var shard records.WeightsEntry
		for _, e := range f.open(v2).Entries {
			if e.Entry == records.EntryFile && strings.HasSuffix(e.Name, ".safetensors") {
				shard = e
				break
			}
		}
		require.Greater(t, shard.Size, int64(3000), "the file spans several ranges of the test's ChunkSize")
		key := dataset.AttachmentKey(v2, shard.Payload)
		good, _, err := store.ReadAll(ctx, f.st, key)
		require.NoError(t, err)
		for name, damaged := range map[string][]byte{
			"flipped": func() []byte { b := bytes.Clone(good); b[len(b)/2] ^= 0x10; return b }(),
			"short":   good[:len(good)-100],
		} {
			_, err = f.st.Put(ctx, key, bytes.NewReader(damaged), int64(len(damaged)))
			require.NoError(t, err)
			_, err = f.pull(v2, dir)
			require.Error(t, err, name)
			assert.Equal(t, stagecmd.ExitCorrupt, exitCode(err), "%s: %v", name, err)
			assert.Contains(t, err.Error(), shard.Name, name)
			requireUntouched(t, dir, before, v1)
		}
	})
}
