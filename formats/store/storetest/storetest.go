package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/store"
)

// clockSlack is how far a ModTime may be from the test's own clock: the store
// uses its own clock (S3 Last-Modified has one-second resolution).
const clockSlack = 10 * time.Second

// waitLimit bounds every wait for a store call that must return.
const waitLimit = 30 * time.Second

type conformanceTest struct {
	name string
	fn   func(t *testing.T, s store.Store)
}

var conformance = []conformanceTest{
	{"Absent", testAbsent},
	{"PutGet", testPutGet},
	{"PutReplaces", testPutReplaces},
	{"ETagNeverRepeats", testETagNeverRepeats},
	{"GetSnapshot", testGetSnapshot},
	{"GetUnderOverwrite", testGetUnderOverwrite},
	{"GetRange", testGetRange},
	{"PutIfAbsent", testPutIfAbsent},
	{"PutIfMatch", testPutIfMatch},
	{"Delete", testDelete},
	{"List", testList},
	{"ListStops", testListStops},
	{"ListMany", testListMany},
	{"InvalidKeys", testInvalidKeys},
	{"KeyCharacters", testKeyCharacters},
	{"UnknownSize", testUnknownSize},
	{"SizeMismatch", testSizeMismatch},
	{"ReaderError", testReaderError},
	{"Empty", testEmpty},
	{"Large", testLarge},
	{"RacePutIfAbsent", testRacePutIfAbsent},
	{"RaceCounter", testRaceCounter},
	{"CancelPut", testCancelPut},
	{"Leftovers", testLeftovers},
}

// Quirks names known, documented deviations of a server from the contract
// that kiln does not depend on. Each is a reason string: empty means the
// server must conform. A quirk weakens exactly one assertion and the test
// logs the reason, so a deviation is never silently accepted.
type Quirks struct {
	// StaleGetETag: under concurrent replacement, Get may report the ETag
	// of another version than the bytes it yields (the bytes are still one
	// whole version). Kiln never replaces an object it also reads: shards
	// and manifests are written once under unique keys.
	StaleGetETag string
}

// Run checks the store.Store contract. newStore must return a fresh, empty
// store each time; it is called once per subtest with that subtest's t, so
// it can use t.TempDir and t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()
	RunWithQuirks(t, Quirks{}, newStore)
}

// RunWithQuirks is Run for a server with known deviations.
func RunWithQuirks(t *testing.T, q Quirks, newStore func(t *testing.T) store.Store) {
	t.Helper()
	for _, tc := range conformance {
		fn := tc.fn
		if tc.name == "GetUnderOverwrite" && q.StaleGetETag != "" {
			fn = func(t *testing.T, s store.Store) { getUnderOverwrite(t, s, q.StaleGetETag) }
		}
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			require.NotNil(t, s, "newStore returned nil")
			require.NotEmpty(t, s.URI(), "URI")
			fn(t, s)
		})
	}
}

// ---- helpers ----

// payload is n bytes that differ with seed.
func payload(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x6b696c6e))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// opaque hides io.ReaderAt, io.Seeker and io.WriterTo, as a pipe or network
// body would, so back ends cannot take shortcuts through them.
type opaque struct{ r io.Reader }

func (o opaque) Read(p []byte) (int, error) { return o.r.Read(p) }

func put(t *testing.T, s store.Store, key string, data []byte) store.Info {
	t.Helper()
	info, err := s.Put(t.Context(), key, bytes.NewReader(data), int64(len(data)))
	require.NoError(t, err, "Put %q", key)
	return info
}

// requireContent checks that Get and Stat of key describe exactly data.
func requireContent(t *testing.T, s store.Store, key string, data []byte) store.Info {
	t.Helper()
	got, info, err := store.ReadAll(t.Context(), s, key)
	require.NoError(t, err, "Get %q", key)
	require.True(t, bytes.Equal(data, got), "Get %q: content differs: got %d bytes, want %d", key, len(got), len(data))
	require.Equal(t, key, info.Key, "Get %q: Info.Key", key)
	require.Equal(t, int64(len(data)), info.Size, "Get %q: Info.Size", key)
	require.NotEmpty(t, info.ETag, "Get %q: Info.ETag", key)
	st, err := s.Stat(t.Context(), key)
	require.NoError(t, err, "Stat %q", key)
	require.Equal(t, info.Key, st.Key, "Stat %q: Key", key)
	require.Equal(t, info.Size, st.Size, "Stat %q: Size", key)
	require.Equal(t, info.ETag, st.ETag, "Stat %q and Get %q disagree on ETag", key, key)
	return st
}

func requireAbsent(t *testing.T, s store.Store, key string) {
	t.Helper()
	_, err := s.Stat(t.Context(), key)
	require.ErrorIs(t, err, store.ErrNotExist, "Stat %q", key)
	rc, _, err := s.Get(t.Context(), key)
	if err == nil {
		rc.Close()
	}
	require.ErrorIs(t, err, store.ErrNotExist, "Get %q", key)
}

// requireInfo checks what a write returned.
func requireInfo(t *testing.T, info store.Info, key string, size int, before time.Time) {
	t.Helper()
	require.Equal(t, key, info.Key, "Info.Key")
	require.Equal(t, int64(size), info.Size, "Info.Size")
	require.NotEmpty(t, info.ETag, "Info.ETag")
	requireRecent(t, info.ModTime, before, "Info.ModTime of %q", key)
}

func requireRecent(t *testing.T, mt, before time.Time, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	require.False(t, mt.IsZero(), "%s is zero", msg)
	after := time.Now()
	require.Truef(t, !mt.Before(before.Add(-clockSlack)) && !mt.After(after.Add(clockSlack)),
		"%s = %v, not within %v of the write (%v .. %v)", msg, mt, clockSlack, before, after)
}

func listAll(t *testing.T, s store.Store, prefix string) []store.Info {
	t.Helper()
	var infos []store.Info
	err := s.List(t.Context(), prefix, func(i store.Info) error {
		infos = append(infos, i)
		return nil
	})
	require.NoError(t, err, "List %q", prefix)
	return infos
}

func listKeys(t *testing.T, s store.Store, prefix string) []string {
	t.Helper()
	keys := []string{}
	for _, i := range listAll(t, s, prefix) {
		keys = append(keys, i.Key)
	}
	slices.Sort(keys)
	return keys
}

func readRange(ctx context.Context, s store.Store, key string, off, n int64) ([]byte, error) {
	rc, err := s.GetRange(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// ---- the contract ----

func testAbsent(t *testing.T, s store.Store) {
	ctx := t.Context()
	requireAbsent(t, s, "absent")
	requireAbsent(t, s, "no/such/key")
	_, err := s.GetRange(ctx, "absent", 0, -1)
	require.ErrorIs(t, err, store.ErrNotExist, "GetRange of an absent key")
	_, err = s.GetRange(ctx, "absent", 0, 0)
	require.ErrorIs(t, err, store.ErrNotExist, "GetRange(0, 0) of an absent key")

	put(t, s, "dir/sub/file", []byte("x"))
	// A prefix of a key, and a path through an object, are not objects.
	requireAbsent(t, s, "dir")
	requireAbsent(t, s, "dir/sub")
	requireAbsent(t, s, "dir/sub/file/deeper")
	requireAbsent(t, s, "dir/su")
	require.Empty(t, listKeys(t, s, "nothing"), "List of a prefix nothing has")
}

func testPutGet(t *testing.T, s store.Store) {
	data := payload(1, 1000)
	before := time.Now()
	info := put(t, s, "a/b/obj.bin", data)
	requireInfo(t, info, "a/b/obj.bin", len(data), before)

	st := requireContent(t, s, "a/b/obj.bin", data)
	require.Equal(t, info.ETag, st.ETag, "Put and Stat disagree on ETag")
	require.True(t, info.ModTime.Equal(st.ModTime), "Put's ModTime %v, Stat's %v", info.ModTime, st.ModTime)
	requireRecent(t, st.ModTime, before, "Stat ModTime")

	ls := listAll(t, s, "")
	require.Len(t, ls, 1, "List after one Put")
	require.Equal(t, "a/b/obj.bin", ls[0].Key, "List Key")
	require.Equal(t, int64(len(data)), ls[0].Size, "List Size")
	require.Equal(t, info.ETag, ls[0].ETag, "List and Put disagree on ETag")
	requireRecent(t, ls[0].ModTime, before, "List ModTime")
}

func testPutReplaces(t *testing.T, s store.Store) {
	v1 := put(t, s, "k", []byte("version one"))
	v2 := put(t, s, "k", []byte("version two")) // same size
	require.NotEqual(t, v1.ETag, v2.ETag, "replacing an object must change its ETag")
	st := requireContent(t, s, "k", []byte("version two"))
	require.Equal(t, v2.ETag, st.ETag)

	v3 := put(t, s, "k", []byte("3"))
	require.NotEqual(t, v2.ETag, v3.ETag)
	requireContent(t, s, "k", []byte("3"))
	require.Equal(t, []string{"k"}, listKeys(t, s, ""), "replacing must not add keys")
}

// testETagNeverRepeats replaces one key many times with distinct contents of
// one size, in quick succession: an ETag seen before must never come back, or
// PutIfMatch with a stale ETag would succeed (ABA) and lose updates.
func testETagNeverRepeats(t *testing.T, s store.Store) {
	ctx := t.Context()
	seen := map[string]int{}
	var etags []string
	for i := range 60 {
		info := put(t, s, "aba", []byte(fmt.Sprintf("value %04d", i)))
		if j, ok := seen[info.ETag]; ok {
			t.Fatalf("write %d got ETag %q, the ETag of write %d: a stale ETag matches again", i, info.ETag, j)
		}
		seen[info.ETag] = i
		etags = append(etags, info.ETag)
	}
	// Deleting and creating the key again (same size, new content) must not
	// bring an old ETag back either.
	for i := 60; i < 70; i++ {
		require.NoError(t, s.Delete(ctx, "aba"))
		info, err := s.PutIfAbsent(ctx, "aba", bytes.NewReader([]byte(fmt.Sprintf("value %04d", i))), 10)
		require.NoError(t, err, "PutIfAbsent after Delete")
		if j, ok := seen[info.ETag]; ok {
			t.Fatalf("write %d after a Delete got ETag %q, the ETag of write %d", i, info.ETag, j)
		}
		seen[info.ETag] = i
		etags = append(etags, info.ETag)
	}
	for i, e := range etags[:len(etags)-1] {
		_, err := s.PutIfMatch(ctx, "aba", bytes.NewReader([]byte("stale!")), 6, e)
		require.ErrorIs(t, err, store.ErrPrecondition, "PutIfMatch with the ETag of write %d", i)
	}
	requireContent(t, s, "aba", []byte(fmt.Sprintf("value %04d", 69)))
}

func testGetSnapshot(t *testing.T, s store.Store) {
	ctx := t.Context()
	v1 := payload(2, 3<<20)
	v2 := payload(3, 1<<20)
	put(t, s, "snap", v1)
	rc, info, err := s.Get(ctx, "snap")
	require.NoError(t, err)
	defer rc.Close()
	head := make([]byte, 1000)
	_, err = io.ReadFull(rc, head)
	require.NoError(t, err)
	put(t, s, "snap", v2)
	rest, err := io.ReadAll(rc)
	require.NoError(t, err, "reading an object that was replaced meanwhile")
	got := append(head, rest...)
	require.Equal(t, int64(len(v1)), info.Size, "Get's Info.Size")
	require.True(t, bytes.Equal(v1, got), "Get must yield the object its Info describes, even if replaced meanwhile: got %d bytes", len(got))
	requireContent(t, s, "snap", v2)
}

// testGetUnderOverwrite reads an object while another goroutine keeps
// replacing it: every Get's Info (ETag, Size) must describe the bytes that
// Get yields, or a read-modify-write loop would pair one version's bytes
// with another's ETag and PutIfMatch would lose updates.
func testGetUnderOverwrite(t *testing.T, s store.Store) { getUnderOverwrite(t, s, "") }

// getUnderOverwrite: every Get yields one whole written version, and (unless
// staleETag explains why not) an Info describing that version.
func getUnderOverwrite(t *testing.T, s store.Store, staleETag string) {
	const writes = 300
	ctx := t.Context()
	content := func(i int) []byte { return []byte(fmt.Sprintf("version %d %s", i, bytes.Repeat([]byte{'x'}, i%17))) }
	etags := make([]string, writes)
	etags[0] = put(t, s, "hot", content(0)).ETag
	type observed struct {
		body []byte
		info store.Info
	}
	var (
		mu   sync.Mutex
		seen []observed
		done atomic.Bool
		wg   sync.WaitGroup
		errs = make(chan error, 4)
	)
	wg.Go(func() {
		defer done.Store(true)
		for i := 1; i < writes; i++ {
			b := content(i)
			info, err := s.Put(ctx, "hot", bytes.NewReader(b), int64(len(b)))
			if err != nil {
				errs <- fmt.Errorf("Put: %w", err)
				return
			}
			mu.Lock()
			etags[i] = info.ETag
			mu.Unlock()
		}
	})
	for range 3 {
		wg.Go(func() {
			for !done.Load() {
				b, info, err := store.ReadAll(ctx, s, "hot")
				if err != nil {
					errs <- fmt.Errorf("Get: %w", err)
					return
				}
				mu.Lock()
				seen = append(seen, observed{b, info})
				mu.Unlock()
				time.Sleep(100 * time.Microsecond) // leave the writer some CPU
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	byContent := map[string]string{}
	for i, e := range etags {
		byContent[string(content(i))] = e
	}
	bad := 0
	for _, o := range seen {
		want, ok := byContent[string(o.body)]
		require.True(t, ok, "Get yielded %q, which was never written", o.body)
		if o.info.ETag != want || o.info.Size != int64(len(o.body)) {
			if staleETag != "" && o.info.Size == int64(len(o.body)) {
				bad++
				continue
			}
			if bad < 5 {
				t.Errorf("Get yielded %q (ETag %s when written) but reported ETag %s, Size %d", o.body, want, o.info.ETag, o.info.Size)
			}
			bad++
		}
	}
	if staleETag != "" {
		t.Logf("known deviation (%s): %d of %d Gets reported another version's ETag", staleETag, bad, len(seen))
		bad = 0
	}
	require.Zero(t, bad, "of %d Gets during %d replacements, %d reported an Info that does not describe their bytes", len(seen), writes, bad)
	t.Logf("%d Gets during %d replacements", len(seen), writes)
}

func testGetRange(t *testing.T, s store.Store) {
	ctx := t.Context()
	data := []byte("0123456789")
	put(t, s, "r", data)
	for _, c := range []struct {
		off, n int64
		want   string
	}{
		{0, -1, "0123456789"},
		{0, 4, "0123"},
		{3, 4, "3456"},
		{7, -1, "789"},
		{9, 1, "9"},
		{9, -1, "9"},
		{0, 10, "0123456789"},
		{7, 100, "789"}, // a length past the end reads to the end
		{0, 0, ""},
		{5, 0, ""},
	} {
		got, err := readRange(ctx, s, "r", c.off, c.n)
		require.NoError(t, err, "GetRange(%d, %d)", c.off, c.n)
		require.Equal(t, c.want, string(got), "GetRange(%d, %d)", c.off, c.n)
	}
	// A range that starts at or beyond the end of a non-empty object is an
	// error, whatever the length.
	for _, c := range []struct{ off, n int64 }{{10, -1}, {10, 1}, {11, -1}, {11, 5}, {1000, 0}, {11, 0}, {-1, -1}, {-1, 5}} {
		_, err := readRange(ctx, s, "r", c.off, c.n)
		require.Error(t, err, "GetRange(%d, %d) of a 10-byte object", c.off, c.n)
		require.NotErrorIs(t, err, store.ErrNotExist, "GetRange(%d, %d): the object exists", c.off, c.n)
	}

	big := payload(4, 1<<20)
	put(t, s, "big", big)
	got, err := readRange(ctx, s, "big", 123457, 300000)
	require.NoError(t, err)
	require.True(t, bytes.Equal(big[123457:423457], got), "GetRange of a 1 MiB object")
	got, err = readRange(ctx, s, "big", 1<<19, -1)
	require.NoError(t, err)
	require.True(t, bytes.Equal(big[1<<19:], got), "GetRange to the end of a 1 MiB object")
}

func testPutIfAbsent(t *testing.T, s store.Store) {
	ctx := t.Context()
	before := time.Now()
	info, err := s.PutIfAbsent(ctx, "once", bytes.NewReader([]byte("first")), 5)
	require.NoError(t, err, "PutIfAbsent of an absent key")
	requireInfo(t, info, "once", 5, before)
	st := requireContent(t, s, "once", []byte("first"))
	require.Equal(t, info.ETag, st.ETag, "PutIfAbsent and Stat disagree on ETag")

	_, err = s.PutIfAbsent(ctx, "once", bytes.NewReader([]byte("second")), 6)
	require.ErrorIs(t, err, store.ErrExist, "PutIfAbsent of an existing key")
	st2 := requireContent(t, s, "once", []byte("first"))
	require.Equal(t, st.ETag, st2.ETag, "a failed PutIfAbsent must not touch the object")

	_, err = s.PutIfAbsent(ctx, "once", opaque{bytes.NewReader([]byte("third"))}, -1)
	require.ErrorIs(t, err, store.ErrExist, "PutIfAbsent of an existing key, unknown size")
	requireContent(t, s, "once", []byte("first"))

	// After a Delete, the key is absent again.
	require.NoError(t, s.Delete(ctx, "once"))
	_, err = s.PutIfAbsent(ctx, "once", bytes.NewReader([]byte("again")), 5)
	require.NoError(t, err, "PutIfAbsent after Delete")
	requireContent(t, s, "once", []byte("again"))

	// Nested keys and unknown size.
	_, err = s.PutIfAbsent(ctx, "x/y/z", opaque{bytes.NewReader([]byte("nested"))}, -1)
	require.NoError(t, err)
	requireContent(t, s, "x/y/z", []byte("nested"))
	require.Equal(t, []string{"once", "x/y/z"}, listKeys(t, s, ""))
}

func testPutIfMatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	v1 := put(t, s, "ptr", []byte("v1"))

	before := time.Now()
	v2, err := s.PutIfMatch(ctx, "ptr", bytes.NewReader([]byte("v2")), 2, v1.ETag)
	require.NoError(t, err, "PutIfMatch with the current ETag")
	requireInfo(t, v2, "ptr", 2, before)
	require.NotEqual(t, v1.ETag, v2.ETag, "PutIfMatch must change the ETag")
	st := requireContent(t, s, "ptr", []byte("v2"))
	require.Equal(t, v2.ETag, st.ETag, "PutIfMatch and Stat disagree on ETag")

	// Stale ETag: nothing is written.
	_, err = s.PutIfMatch(ctx, "ptr", bytes.NewReader([]byte("v3")), 2, v1.ETag)
	require.ErrorIs(t, err, store.ErrPrecondition, "PutIfMatch with a stale ETag")
	st = requireContent(t, s, "ptr", []byte("v2"))
	require.Equal(t, v2.ETag, st.ETag, "a failed PutIfMatch must not touch the object")

	for _, etag := range []string{"not-an-etag", "", "*", `"` + v2.ETag + `"`, "W/" + v2.ETag} {
		_, err = s.PutIfMatch(ctx, "ptr", bytes.NewReader([]byte("v3")), 2, etag)
		require.ErrorIs(t, err, store.ErrPrecondition, "PutIfMatch with the made-up ETag %q", etag)
	}
	_, err = s.PutIfMatch(ctx, "ptr", opaque{bytes.NewReader([]byte("v3"))}, -1, v1.ETag)
	require.ErrorIs(t, err, store.ErrPrecondition, "PutIfMatch with a stale ETag, unknown size")
	requireContent(t, s, "ptr", []byte("v2"))

	// The ETags that Get and List report work too.
	_, info, err := store.ReadAll(ctx, s, "ptr")
	require.NoError(t, err)
	v3, err := s.PutIfMatch(ctx, "ptr", opaque{bytes.NewReader([]byte("v3"))}, -1, info.ETag)
	require.NoError(t, err, "PutIfMatch with Get's ETag, unknown size")
	requireContent(t, s, "ptr", []byte("v3"))
	ls := listAll(t, s, "ptr")
	require.Len(t, ls, 1)
	require.Equal(t, v3.ETag, ls[0].ETag, "List and PutIfMatch disagree on ETag")
	_, err = s.PutIfMatch(ctx, "ptr", bytes.NewReader([]byte("v4")), 2, ls[0].ETag)
	require.NoError(t, err, "PutIfMatch with List's ETag")
	requireContent(t, s, "ptr", []byte("v4"))

	// Absent key: ErrPrecondition, and the key stays absent, whatever the ETag.
	for _, etag := range []string{v1.ETag, "", "*", "not-an-etag"} {
		_, err = s.PutIfMatch(ctx, "missing", bytes.NewReader([]byte("x")), 1, etag)
		require.ErrorIs(t, err, store.ErrPrecondition, "PutIfMatch(etag %q) of an absent key", etag)
		requireAbsent(t, s, "missing")
	}
	// A deleted key is absent too, even with the ETag it had.
	require.NoError(t, s.Delete(ctx, "ptr"))
	_, err = s.PutIfMatch(ctx, "ptr", bytes.NewReader([]byte("v5")), 2, v3.ETag)
	require.ErrorIs(t, err, store.ErrPrecondition, "PutIfMatch of a deleted key")
	requireAbsent(t, s, "ptr")
	require.Empty(t, listKeys(t, s, ""))
}

func testDelete(t *testing.T, s store.Store) {
	ctx := t.Context()
	put(t, s, "d/one", []byte("1"))
	put(t, s, "d/two", []byte("2"))
	put(t, s, "d/sub/three", []byte("3"))

	require.NoError(t, s.Delete(ctx, "d/one"))
	requireAbsent(t, s, "d/one")
	requireContent(t, s, "d/two", []byte("2"))
	require.Equal(t, []string{"d/sub/three", "d/two"}, listKeys(t, s, ""))

	require.NoError(t, s.Delete(ctx, "d/one"), "deleting an absent object is not an error")
	require.NoError(t, s.Delete(ctx, "never/existed"), "deleting an absent object is not an error")
	// "d" and "d/sub" are prefixes, not objects: deleting them is deleting
	// absent objects, and must leave the objects under them alone.
	require.NoError(t, s.Delete(ctx, "d/sub"), "deleting a prefix that is not an object")
	require.NoError(t, s.Delete(ctx, "d"), "deleting a prefix that is not an object")
	require.NoError(t, s.Delete(ctx, "d/two/x"), "deleting a key below an object")
	requireContent(t, s, "d/two", []byte("2"))
	require.Equal(t, []string{"d/sub/three", "d/two"}, listKeys(t, s, ""))

	require.NoError(t, s.Delete(ctx, "d/sub/three"))
	require.NoError(t, s.Delete(ctx, "d/two"))
	require.Empty(t, listKeys(t, s, ""))
	// The key space is usable again after everything under a prefix went.
	put(t, s, "d/sub/four", []byte("4"))
	requireContent(t, s, "d/sub/four", []byte("4"))
	require.Equal(t, []string{"d/sub/four"}, listKeys(t, s, ""))
}

func testList(t *testing.T, s store.Store) {
	ctx := t.Context()
	keys := []string{"a/b1", "a/b2/c", "a/c", "ab", "b/x/y/z", "top", "a/b2/d/e"}
	infos := map[string]store.Info{}
	for i, k := range keys {
		infos[k] = put(t, s, k, payload(uint64(i), 10+i))
	}
	// A conditional write and a delete, so back ends with lock or temporary
	// files have some.
	_, err := s.PutIfAbsent(ctx, "gone", bytes.NewReader([]byte("x")), 1)
	require.NoError(t, err)
	require.NoError(t, s.Delete(ctx, "gone"))

	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"a/b1", "a/b2/c", "a/b2/d/e", "a/c", "ab", "b/x/y/z", "top"}},
		{"a/", []string{"a/b1", "a/b2/c", "a/b2/d/e", "a/c"}},
		{"a/b", []string{"a/b1", "a/b2/c", "a/b2/d/e"}},
		{"a", []string{"a/b1", "a/b2/c", "a/b2/d/e", "a/c", "ab"}},
		{"a/b2/", []string{"a/b2/c", "a/b2/d/e"}},
		{"a/b2", []string{"a/b2/c", "a/b2/d/e"}},
		{"a/b2/d", []string{"a/b2/d/e"}},
		{"b/x/", []string{"b/x/y/z"}},
		{"b/x/y/z", []string{"b/x/y/z"}},
		{"top", []string{"top"}},
		{"t", []string{"top"}},
		{"a/b1/", []string{}},    // an object is not a directory
		{"top/", []string{}},     // likewise
		{"zzz", []string{}},      // nothing there
		{"a/zz/", []string{}},    // nothing there
		{"b/x/y/z/", []string{}}, // nothing there
	} {
		got := listAll(t, s, c.prefix)
		gotKeys := []string{}
		for _, i := range got {
			gotKeys = append(gotKeys, i.Key)
			want, ok := infos[i.Key]
			if !assert.True(t, ok, "List %q reported %q, which was never written", c.prefix, i.Key) {
				continue
			}
			assert.Equal(t, want.Size, i.Size, "List %q: Size of %q", c.prefix, i.Key)
			assert.Equal(t, want.ETag, i.ETag, "List %q: ETag of %q", c.prefix, i.Key)
			assert.False(t, i.ModTime.IsZero(), "List %q: ModTime of %q", c.prefix, i.Key)
		}
		slices.Sort(gotKeys)
		require.Equal(t, c.want, gotKeys, "List %q must report each matching key exactly once", c.prefix)
	}

	for _, bad := range []string{"/", "/a", "a//", "a//b", "../", ".kiln", ".kiln-tmp/", "a/../b"} {
		err := s.List(ctx, bad, func(store.Info) error { return nil })
		require.ErrorIs(t, err, store.ErrInvalidKey, "List %q", bad)
	}
}

func testListStops(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i := range 20 {
		put(t, s, fmt.Sprintf("p/%02d", i), []byte{byte(i)})
	}
	stop := errors.New("stop here")
	calls := 0
	err := s.List(ctx, "", func(store.Info) error {
		calls++
		return stop
	})
	require.ErrorIs(t, err, stop, "List must return fn's error")
	require.Equal(t, 1, calls, "List must stop at fn's first error")

	calls = 0
	err = s.List(ctx, "p/", func(store.Info) error {
		calls++
		if calls == 5 {
			return stop
		}
		return nil
	})
	require.ErrorIs(t, err, stop)
	require.Equal(t, 5, calls)

	// A cancelled context stops the listing with an error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err = s.List(cctx, "", func(store.Info) error { return nil })
	require.Error(t, err, "List with a cancelled context")
}

// testListMany lists more objects than one S3 ListObjects page (1000).
func testListMany(t *testing.T, s store.Store) {
	const n = 1100
	ctx := t.Context()
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("many/%02d/%04d", i%7, i))
	}
	errs := make(chan error, n)
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 8 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= n {
					return
				}
				k := want[i]
				if _, err := s.Put(ctx, k, bytes.NewReader([]byte(k)), int64(len(k))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	slices.Sort(want)
	got := listKeys(t, s, "")
	require.Equal(t, len(want), len(got), "List of %d objects", n)
	require.Equal(t, want, got)
	require.Equal(t, want[:n/7+1], listKeys(t, s, "many/00/"))
}

var invalidKeys = []string{
	"", "/x", "x/", "a//b", "../x", "a/../b", "a/..", "./x", "a/./b", ".",
	".kiln-tmp/x", ".kiln", ".kilnx/y", `a\b`, "a\x00b",
}

func testInvalidKeys(t *testing.T, s store.Store) {
	ctx := t.Context()
	put(t, s, "valid", []byte("v"))
	etag := requireContent(t, s, "valid", []byte("v")).ETag
	for _, k := range invalidKeys {
		require.ErrorIs(t, store.CheckKey(k), store.ErrInvalidKey, "CheckKey(%q)", k)
		_, _, err := s.Get(ctx, k)
		require.ErrorIs(t, err, store.ErrInvalidKey, "Get(%q)", k)
		_, err = s.GetRange(ctx, k, 0, 1)
		require.ErrorIs(t, err, store.ErrInvalidKey, "GetRange(%q)", k)
		_, err = s.Stat(ctx, k)
		require.ErrorIs(t, err, store.ErrInvalidKey, "Stat(%q)", k)
		_, err = s.Put(ctx, k, bytes.NewReader([]byte("x")), 1)
		require.ErrorIs(t, err, store.ErrInvalidKey, "Put(%q)", k)
		_, err = s.PutIfAbsent(ctx, k, bytes.NewReader([]byte("x")), 1)
		require.ErrorIs(t, err, store.ErrInvalidKey, "PutIfAbsent(%q)", k)
		_, err = s.PutIfMatch(ctx, k, bytes.NewReader([]byte("x")), 1, etag)
		require.ErrorIs(t, err, store.ErrInvalidKey, "PutIfMatch(%q)", k)
		err = s.Delete(ctx, k)
		require.ErrorIs(t, err, store.ErrInvalidKey, "Delete(%q)", k)
	}
	require.Equal(t, []string{"valid"}, listKeys(t, s, ""), "invalid keys must write nothing")
	requireContent(t, s, "valid", []byte("v"))
}

func testKeyCharacters(t *testing.T, s store.Store) {
	ctx := t.Context()
	keys := []string{
		"sp ace/file name.txt",
		"plus+sign/a+b",
		"percent%20/100%",
		"amp&eq=semi;comma,/x",
		"query?x=1",
		"hash#frag",
		"tilde~bang!dollar$/quote'paren()star*at@",
		"uni/ünïcødé/κλειδί/键",
		"dots.../..a/a..",
		"colon:brackets[1]{2}",
		".hidden/.x",
		"a/.kilnnot-reserved-below-the-top",
	}
	contents := map[string][]byte{}
	for i, k := range keys {
		require.NoError(t, store.CheckKey(k), "CheckKey(%q)", k)
		data := payload(uint64(100+i), 50+i)
		contents[k] = data
		put(t, s, k, data)
		requireContent(t, s, k, data)
		got, err := readRange(ctx, s, k, 1, 3)
		require.NoError(t, err, "GetRange %q", k)
		require.Equal(t, data[1:4], got, "GetRange %q", k)
	}
	want := slices.Clone(keys)
	slices.Sort(want)
	require.Equal(t, want, listKeys(t, s, ""), "List must report keys exactly as written")
	for _, k := range keys {
		require.Equal(t, []string{k}, listKeys(t, s, k), "List with the key %q as prefix", k)
		info := requireContent(t, s, k, contents[k])
		_, err := s.PutIfMatch(ctx, k, bytes.NewReader(nil), 0, info.ETag)
		require.NoError(t, err, "PutIfMatch %q", k)
		requireContent(t, s, k, nil)
		_, err = s.PutIfAbsent(ctx, k, bytes.NewReader(nil), 0)
		require.ErrorIs(t, err, store.ErrExist, "PutIfAbsent %q", k)
		require.NoError(t, s.Delete(ctx, k), "Delete %q", k)
		requireAbsent(t, s, k)
	}
	require.Empty(t, listKeys(t, s, ""))
}

func testUnknownSize(t *testing.T, s store.Store) {
	ctx := t.Context()
	data := payload(5, 300<<10)
	before := time.Now()
	info, err := s.Put(ctx, "u/put", opaque{bytes.NewReader(data)}, -1)
	require.NoError(t, err, "Put with size -1")
	requireInfo(t, info, "u/put", len(data), before)
	st := requireContent(t, s, "u/put", data)
	require.Equal(t, info.ETag, st.ETag)

	// size -1 with a reader that does have ReadAt/Seek.
	info, err = s.Put(ctx, "u/put", bytes.NewReader(data[:1000]), -1)
	require.NoError(t, err, "Put with size -1")
	requireInfo(t, info, "u/put", 1000, before)
	requireContent(t, s, "u/put", data[:1000])

	info, err = s.PutIfAbsent(ctx, "u/abs", opaque{bytes.NewReader(data)}, -1)
	require.NoError(t, err, "PutIfAbsent with size -1")
	requireInfo(t, info, "u/abs", len(data), before)
	requireContent(t, s, "u/abs", data)

	info, err = s.PutIfMatch(ctx, "u/abs", opaque{bytes.NewReader(data[:77])}, -1, info.ETag)
	require.NoError(t, err, "PutIfMatch with size -1")
	requireInfo(t, info, "u/abs", 77, before)
	requireContent(t, s, "u/abs", data[:77])
}

func testSizeMismatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	data := payload(6, 4096)
	type putFn func(key string, r io.Reader, size int64) error
	ops := []struct {
		name string
		put  putFn
	}{
		{"Put", func(k string, r io.Reader, n int64) error { _, err := s.Put(ctx, k, r, n); return err }},
		{"PutIfAbsent", func(k string, r io.Reader, n int64) error { _, err := s.PutIfAbsent(ctx, k, r, n); return err }},
	}
	readers := []struct {
		name string
		r    func(b []byte) io.Reader
	}{
		{"bytes.Reader", func(b []byte) io.Reader { return bytes.NewReader(b) }},
		{"opaque", func(b []byte) io.Reader { return opaque{bytes.NewReader(b)} }},
	}
	for _, op := range ops {
		for _, rd := range readers {
			for _, c := range []struct {
				name string
				have int   // bytes the reader yields
				size int64 // size claimed
			}{
				{"short", 4000, 4096},
				{"long", 4096, 4000},
				{"empty-claims-some", 0, 10},
				{"some-claims-empty", 10, 0},
			} {
				key := fmt.Sprintf("mm/%s-%s-%s", op.name, rd.name, c.name)
				err := op.put(key, rd.r(data[:c.have]), c.size)
				require.Error(t, err, "%s of %d bytes claiming size %d (%s) must fail", op.name, c.have, c.size, rd.name)
				requireAbsent(t, s, key)
			}
		}
	}
	// A failed Put leaves the old object in place.
	put(t, s, "mm/existing", []byte("old"))
	_, err := s.Put(ctx, "mm/existing", opaque{bytes.NewReader(data)}, 100)
	require.Error(t, err, "Put claiming fewer bytes than the reader has")
	requireContent(t, s, "mm/existing", []byte("old"))
	_, err = s.Put(ctx, "mm/existing", bytes.NewReader(data[:10]), 100)
	require.Error(t, err, "Put claiming more bytes than the reader has")
	info := requireContent(t, s, "mm/existing", []byte("old"))
	_, err = s.PutIfMatch(ctx, "mm/existing", bytes.NewReader(data), 100, info.ETag)
	require.Error(t, err, "PutIfMatch claiming fewer bytes than the reader has")
	requireContent(t, s, "mm/existing", []byte("old"))
	require.Equal(t, []string{"mm/existing"}, listKeys(t, s, ""))
}

type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

// testReaderError writes from readers that fail (after all their bytes, in
// the exact-size case): the write fails and publishes nothing.
func testReaderError(t *testing.T, s store.Store) {
	ctx := t.Context()
	data := payload(7, 200<<10)
	boom := errors.New("reader failed")
	fail := func() io.Reader { return &failingReader{bytes.NewReader(data), boom} }
	put(t, s, "re/existing", []byte("old"))
	for _, size := range []int64{int64(len(data)), int64(len(data)) + 10, -1} {
		_, err := s.Put(ctx, "re/new", fail(), size)
		require.Error(t, err, "Put(size %d) from a reader that fails", size)
		_, err = s.PutIfAbsent(ctx, "re/new", fail(), size)
		require.Error(t, err, "PutIfAbsent(size %d) from a reader that fails", size)
		requireAbsent(t, s, "re/new")

		_, err = s.Put(ctx, "re/existing", fail(), size)
		require.Error(t, err, "Put(size %d) over an object, from a reader that fails", size)
		info := requireContent(t, s, "re/existing", []byte("old"))
		_, err = s.PutIfMatch(ctx, "re/existing", fail(), size, info.ETag)
		require.Error(t, err, "PutIfMatch(size %d) from a reader that fails", size)
		requireContent(t, s, "re/existing", []byte("old"))
	}
	require.Equal(t, []string{"re/existing"}, listKeys(t, s, ""))
}

func testEmpty(t *testing.T, s store.Store) {
	ctx := t.Context()
	before := time.Now()
	info := put(t, s, "e/known", nil)
	requireInfo(t, info, "e/known", 0, before)
	requireContent(t, s, "e/known", nil)

	info, err := s.Put(ctx, "e/unknown", opaque{bytes.NewReader(nil)}, -1)
	require.NoError(t, err, "Put of 0 bytes, size -1")
	requireInfo(t, info, "e/unknown", 0, before)
	requireContent(t, s, "e/unknown", nil)

	info, err = s.PutIfAbsent(ctx, "e/abs", bytes.NewReader(nil), 0)
	require.NoError(t, err, "PutIfAbsent of 0 bytes")
	requireInfo(t, info, "e/abs", 0, before)
	_, err = s.PutIfAbsent(ctx, "e/abs", bytes.NewReader(nil), 0)
	require.ErrorIs(t, err, store.ErrExist)
	info, err = s.PutIfMatch(ctx, "e/abs", bytes.NewReader([]byte("now full")), 8, info.ETag)
	require.NoError(t, err, "PutIfMatch replacing an empty object")
	requireContent(t, s, "e/abs", []byte("now full"))
	_, err = s.PutIfMatch(ctx, "e/abs", bytes.NewReader(nil), 0, info.ETag)
	require.NoError(t, err, "PutIfMatch with an empty object")
	requireContent(t, s, "e/abs", nil)

	for _, c := range []struct{ off, n int64 }{{0, -1}, {0, 0}, {0, 5}} {
		got, err := readRange(ctx, s, "e/known", c.off, c.n)
		require.NoError(t, err, "GetRange(%d, %d) of an empty object", c.off, c.n)
		require.Empty(t, got)
	}
	_, err = readRange(ctx, s, "e/known", 1, -1)
	require.Error(t, err, "GetRange(1, -1) of an empty object starts beyond its end")

	ls := listAll(t, s, "e/")
	require.Len(t, ls, 3)
	for _, i := range ls {
		require.Zero(t, i.Size, "List Size of %q", i.Key)
		require.NotEmpty(t, i.ETag, "List ETag of %q", i.Key)
	}
}

func testLarge(t *testing.T, s store.Store) {
	ctx := t.Context()
	data := payload(8, 5<<20+12345)
	before := time.Now()
	info := put(t, s, "large/known", data)
	requireInfo(t, info, "large/known", len(data), before)
	requireContent(t, s, "large/known", data)
	got, err := readRange(ctx, s, "large/known", 3<<20, 1<<20)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data[3<<20:4<<20], got), "GetRange of a large object")

	info, err = s.Put(ctx, "large/unknown", opaque{bytes.NewReader(data)}, -1)
	require.NoError(t, err, "Put of a large object of unknown size")
	requireInfo(t, info, "large/unknown", len(data), before)
	requireContent(t, s, "large/unknown", data)
}

// testRacePutIfAbsent races writers for one key: exactly one wins, and the
// object is the winner's.
func testRacePutIfAbsent(t *testing.T, s store.Store) {
	const writers = 8
	ctx := t.Context()
	for round := range 5 {
		key := fmt.Sprintf("race/%d", round)
		contents := make([][]byte, writers)
		for i := range contents {
			contents[i] = payload(uint64(1000*round+i), 256<<10)
		}
		infos := make([]store.Info, writers)
		errs := make([]error, writers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range writers {
			wg.Go(func() {
				<-start
				infos[i], errs[i] = s.PutIfAbsent(ctx, key, opaque{bytes.NewReader(contents[i])}, int64(len(contents[i])))
			})
		}
		close(start)
		wg.Wait()
		var winners []int
		for i, err := range errs {
			if err == nil {
				winners = append(winners, i)
				continue
			}
			assert.ErrorIs(t, err, store.ErrExist, "round %d: losing writer %d", round, i)
		}
		require.Len(t, winners, 1, "round %d: exactly one of %d racing PutIfAbsent calls must succeed; winners %v", round, writers, winners)
		w := winners[0]
		st := requireContent(t, s, key, contents[w])
		require.Equal(t, infos[w].ETag, st.ETag, "round %d: the winner's ETag", round)
	}
}

// testRaceCounter increments a counter from many goroutines with
// read-modify-write loops over PutIfMatch: no increment may be lost.
func testRaceCounter(t *testing.T, s store.Store) {
	const (
		workers   = 8
		perWorker = 12
	)
	ctx := t.Context()
	_, err := s.PutIfAbsent(ctx, "counter", bytes.NewReader([]byte("0")), 1)
	require.NoError(t, err)

	var wins, conflicts atomic.Int64
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range perWorker {
				for attempt := 0; ; attempt++ {
					if attempt > 1000 {
						errs <- fmt.Errorf("worker %d: no progress after %d attempts", w, attempt)
						return
					}
					var etag string
					var body []byte
					var err error
					if w%2 == 0 {
						// Get's Info describes exactly what it read.
						var info store.Info
						body, info, err = store.ReadAll(ctx, s, "counter")
						etag = info.ETag
					} else {
						// Stat then Get: the body may be newer than the ETag,
						// in which case PutIfMatch must fail.
						var info store.Info
						info, err = s.Stat(ctx, "counter")
						if err == nil {
							etag = info.ETag
							body, _, err = store.ReadAll(ctx, s, "counter")
						}
					}
					if err != nil {
						errs <- fmt.Errorf("worker %d: read: %w", w, err)
						return
					}
					n, err := strconv.Atoi(string(body))
					if err != nil {
						errs <- fmt.Errorf("worker %d: counter holds %q", w, body)
						return
					}
					next := []byte(strconv.Itoa(n + 1))
					_, err = s.PutIfMatch(ctx, "counter", bytes.NewReader(next), int64(len(next)), etag)
					if errors.Is(err, store.ErrPrecondition) {
						conflicts.Add(1)
						continue
					}
					if err != nil {
						errs <- fmt.Errorf("worker %d: PutIfMatch: %w", w, err)
						return
					}
					wins.Add(1)
					break
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("%d increments, %d conflicts retried", wins.Load(), conflicts.Load())
	require.EqualValues(t, workers*perWorker, wins.Load())
	requireContent(t, s, "counter", []byte(strconv.Itoa(workers*perWorker)))
}

// blockingReader yields head, then blocks until release is closed, then
// yields tail. It does not watch any context: the store must.
type blockingReader struct {
	head, tail *bytes.Reader
	blocked    chan struct{} // closed when Read first blocks
	release    chan struct{}
	once       sync.Once
}

func newBlockingReader(head, tail []byte) *blockingReader {
	return &blockingReader{
		head: bytes.NewReader(head), tail: bytes.NewReader(tail),
		blocked: make(chan struct{}), release: make(chan struct{}),
	}
}

func (b *blockingReader) Read(p []byte) (int, error) {
	if b.head.Len() > 0 {
		return b.head.Read(p)
	}
	b.once.Do(func() { close(b.blocked) })
	<-b.release
	return b.tail.Read(p)
}

func testCancelPut(t *testing.T, s store.Store) {
	put(t, s, "c/existing", []byte("old"))
	head, tail := payload(9, 256<<10), payload(10, 256<<10)
	size := int64(len(head) + len(tail))
	type op func(ctx context.Context, r io.Reader) error
	cases := []struct {
		name, key string
		op        op
	}{
		{"Put", "c/new", func(ctx context.Context, r io.Reader) error { _, err := s.Put(ctx, "c/new", r, size); return err }},
		{"Put-unknown-size", "c/new", func(ctx context.Context, r io.Reader) error { _, err := s.Put(ctx, "c/new", r, -1); return err }},
		{"Put-existing", "c/existing", func(ctx context.Context, r io.Reader) error {
			_, err := s.Put(ctx, "c/existing", r, size)
			return err
		}},
		{"PutIfAbsent", "c/new", func(ctx context.Context, r io.Reader) error {
			_, err := s.PutIfAbsent(ctx, "c/new", r, size)
			return err
		}},
		{"PutIfMatch", "c/existing", func(ctx context.Context, r io.Reader) error {
			info, err := s.Stat(context.Background(), "c/existing")
			if err != nil {
				return fmt.Errorf("unexpected: %w", err)
			}
			_, err = s.PutIfMatch(ctx, "c/existing", r, size, info.ETag)
			return err
		}},
	}
	for _, c := range cases {
		ctx, cancel := context.WithCancel(t.Context())
		r := newBlockingReader(head, tail)
		done := make(chan error, 1)
		go func() { done <- c.op(ctx, r) }()
		select {
		case <-r.blocked:
		case err := <-done:
			cancel()
			t.Fatalf("%s returned (%v) before reading all of its reader", c.name, err)
		case <-time.After(waitLimit):
			cancel()
			close(r.release)
			t.Fatalf("%s never blocked in its reader", c.name)
		}
		cancel()
		// Give the store a moment to see the cancellation while the reader
		// is still blocked, then let the reader finish: a store that ignores
		// the context would now complete the write.
		time.Sleep(50 * time.Millisecond)
		close(r.release)
		select {
		case err := <-done:
			require.Error(t, err, "%s with a context cancelled mid-write must fail", c.name)
		case <-time.After(waitLimit):
			t.Fatalf("%s did not return within %v of its context being cancelled", c.name, waitLimit)
		}
		if c.key == "c/existing" {
			requireContent(t, s, "c/existing", []byte("old"))
		} else {
			requireAbsent(t, s, c.key)
		}
	}

	// A context cancelled before the call.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := s.Put(ctx, "c/never", bytes.NewReader([]byte("x")), 1)
	require.Error(t, err, "Put with a cancelled context")
	_, err = s.PutIfAbsent(ctx, "c/never", bytes.NewReader([]byte("x")), 1)
	require.Error(t, err, "PutIfAbsent with a cancelled context")
	requireAbsent(t, s, "c/never")
	require.Equal(t, []string{"c/existing"}, listKeys(t, s, ""))
}

func testLeftovers(t *testing.T, s store.Store) {
	sw, ok := s.(store.Sweeper)
	if !ok {
		t.Skipf("%T is not a store.Sweeper", s)
	}
	ctx := t.Context()
	leftovers := func() []store.Info {
		t.Helper()
		var got []store.Info
		err := sw.Leftovers(ctx, time.Now().Add(time.Hour), func(i store.Info) error {
			got = append(got, i)
			return nil
		})
		require.NoError(t, err, "Leftovers")
		return got
	}
	require.Empty(t, leftovers(), "Leftovers of a fresh store")

	// Writes that completed, successfully or not, leave nothing behind.
	data := payload(11, 100<<10)
	put(t, s, "l/a", data)
	_, err := s.Put(ctx, "l/b", opaque{bytes.NewReader(data)}, -1)
	require.NoError(t, err)
	info, err := s.PutIfAbsent(ctx, "l/c", opaque{bytes.NewReader(data)}, -1)
	require.NoError(t, err)
	_, err = s.PutIfAbsent(ctx, "l/c", opaque{bytes.NewReader(data)}, -1)
	require.ErrorIs(t, err, store.ErrExist)
	_, err = s.PutIfAbsent(ctx, "l/c", bytes.NewReader(data), int64(len(data)))
	require.ErrorIs(t, err, store.ErrExist)
	data2 := payload(12, 100<<10)
	_, err = s.PutIfMatch(ctx, "l/c", opaque{bytes.NewReader(data2)}, -1, info.ETag)
	require.NoError(t, err)
	_, err = s.PutIfMatch(ctx, "l/c", opaque{bytes.NewReader(data)}, -1, info.ETag)
	require.ErrorIs(t, err, store.ErrPrecondition)
	_, err = s.PutIfMatch(ctx, "l/absent", opaque{bytes.NewReader(data)}, -1, info.ETag)
	require.ErrorIs(t, err, store.ErrPrecondition)
	_, err = s.Put(ctx, "l/d", opaque{bytes.NewReader(data)}, 10)
	require.Error(t, err)
	require.NoError(t, s.Delete(ctx, "l/a"))
	require.Empty(t, leftovers(), "Leftovers after writes that completed")

	// Leftovers are never objects.
	for _, i := range listAll(t, s, "") {
		require.NotContains(t, i.Key, ".kiln", "List reported bookkeeping %q", i.Key)
	}
}
