package sync

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/sync/synctest"
)

// publishDir publishes the checkpoint in dir with options o.
func (f *fixture) publishDir(ctx context.Context, dir string, o PublishOptions, hook func(string)) (dataset.Result, error) {
	if o.FullEvery == 0 {
		o.FullEvery = DefaultFullEvery
	}
	o.Checkpoint = dir
	return Publish(ctx, f.env, f.st, stagecmd.Output{Name: f.name, Hook: hook}, o)
}

func (f *fixture) writeCk(ck *synctest.Model) string {
	f.t.Helper()
	dir := f.t.TempDir()
	require.NoError(f.t, ck.Write(dir))
	return dir
}

// attachments lists v's attachments with their bytes.
func (f *fixture) attachments(ref dataset.Ref) map[string][]byte {
	f.t.Helper()
	ctx := context.Background()
	v, err := dataset.Open(ctx, f.st, ref)
	require.NoError(f.t, err)
	out := map[string][]byte{}
	require.NoError(f.t, v.Attachments(ctx, func(rel string, _ store.Info) error {
		rc, _, err := v.OpenAttachment(ctx, rel)
		if err != nil {
			return err
		}
		defer rc.Close()
		out[rel], err = io.ReadAll(rc)
		return err
	}))
	return out
}

// manifests lists the committed versions of f.name.
func (f *fixture) committed() []string {
	f.t.Helper()
	var out []string
	require.NoError(f.t, f.st.List(context.Background(), f.name+"/_v/", func(info store.Info) error {
		if strings.HasSuffix(info.Key, "/manifest.json") {
			out = append(out, info.Key)
		}
		return nil
	}))
	return out
}

func (f *fixture) latest() dataset.Ref {
	f.t.Helper()
	l, err := dataset.ReadLatest(context.Background(), f.st, f.name)
	require.NoError(f.t, err)
	return l.Ref()
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestPublishFullLayout (spec §5.1 item 1): the first version is full; its
// attachments are exactly the files an engine loads, byte for byte (no
// trainer files, no other weight formats, nothing unreferenced); its rows
// list every file (sha256) and every tensor of every shard once (xxh3 of
// its bytes), sorted, and the tensors' bytes sum to the index's
// total_size.
func TestPublishFullLayout(t *testing.T) {
	eachStore(t, func(t *testing.T, f *fixture) {
		ck := synctest.Tiny(21, 3, 4, 300)
		dir := f.writeCk(ck)
		res, err := f.publishDir(context.Background(), dir, PublishOptions{}, nil)
		require.NoError(t, err)
		require.True(t, res.Committed)
		w := f.open(res.Ref)
		assert.Equal(t, int64(1), w.Number)
		assert.True(t, w.Full)
		assert.Contains(t, w.FullReason, "no committed version")
		m := w.V.Metrics
		assert.Equal(t, "", m["base"])
		assert.Equal(t, records.EncStored, m["encoding"])
		assert.Equal(t, dir, m["source"])

		att := f.attachments(res.Ref)
		want := engineFiles(t, ck, dir)
		assert.Equal(t, sortedNames(want), sortedNames(att), "attachments are the engine's files, nothing else")
		for name, b := range want {
			assert.Equal(t, sha(b), sha(att[name]), name)
		}
		var idx struct {
			Metadata struct {
				TotalSize int64 `json:"total_size"`
			} `json:"metadata"`
			WeightMap map[string]string `json:"weight_map"`
		}
		require.NoError(t, json.Unmarshal(want["model.safetensors.index.json"], &idx))
		seen := map[string]int{}
		var tensorBytes int64
		for i, e := range w.Entries {
			if i > 0 {
				assert.True(t, entryLess(&w.Entries[i-1], &e), "rows sorted at %d", i)
			}
			assert.Equal(t, records.EncStored, e.Encoding)
			switch e.Entry {
			case records.EntryFile:
				assert.Equal(t, sha(want[e.Name]), e.Checksum, e.Name)
				assert.Equal(t, int64(len(want[e.Name])), e.Size)
				assert.Equal(t, e.Name, e.Payload)
			case records.EntryTensor:
				seen[e.Name]++
				tensorBytes += e.Size
				assert.Equal(t, idx.WeightMap[e.Name], e.File)
				data := want[e.File][e.Offset : e.Offset+e.Size]
				assert.Equal(t, ck.Tensor(e.Name).Data, data, "offset of %s", e.Name)
				assert.Equal(t, tensorChecksum(data), e.Checksum, e.Name)
			}
		}
		assert.Len(t, seen, len(idx.WeightMap))
		for name, n := range seen {
			assert.Equal(t, 1, n, name)
		}
		assert.Equal(t, idx.Metadata.TotalSize, tensorBytes)
		assert.Equal(t, float64(tensorBytes), m["total_bytes"])
		assert.Equal(t, float64(len(idx.WeightMap)), m["tensors"])

		// A lone model.safetensors without index is accepted.
		lone := synctest.Tiny(22, 1, 3, 100)
		lone.Lone = true
		res, err = f.publishDir(context.Background(), f.writeCk(lone), PublishOptions{Full: true}, nil)
		require.NoError(t, err)
		assert.Equal(t, []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"},
			sortedNames(f.attachments(res.Ref)))
	})
}

// TestPublishDelta (spec §5.1 item 4): after a full version, a checkpoint
// with some tensors changed is a delta on it: only the changed tensors
// have payloads, in packs, that turn the base's bytes into the new ones;
// every other row is unchanged and carries the new checksums; the
// metrics name the base. xor/overwrite are used when --base-dir holds the
// base, replace otherwise. A checkpoint equal to its base is an empty
// delta with a new number.
func TestPublishDelta(t *testing.T) {
	cases := []struct {
		name     string
		fraction float64
		encoding string // option
		baseDir  bool
		want     string // encoding of changed rows
	}{
		{"replace without base bytes", 0.3, "", false, records.EncReplace},
		{"xor from base dir", 0.3, "", true, records.EncXOR},
		{"overwrite from base dir", 0.3, records.EncOverwrite, true, records.EncOverwrite},
		{"every tensor", 1, "", false, records.EncReplace},
		{"zero change", 0, "", false, ""},
	}
	eachStore(t, func(t *testing.T, f *fixture) {
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				f.name = fmt.Sprintf("weights/delta%d", i)
				ctx := context.Background()
				ck := synctest.Tiny(uint64(30+i), 2, 5, 400)
				baseCk := f.writeCk(ck)
				base, err := f.publishDir(ctx, baseCk, PublishOptions{}, nil)
				require.NoError(t, err)
				next := ck.Clone()
				changed := mutate(next, tc.fraction, uint64(i))
				if tc.fraction == 0 {
					// The engine's bytes are the base's; only the trainer's
					// state differs, so the version id does too.
					changed = nil
					next.Files["optimizer.pt"] = []byte("the next step's optimizer state")
				}
				o := PublishOptions{Encoding: tc.encoding}
				if tc.baseDir {
					o.BaseDir = fakePullDir(t, f.name, f.open(base.Ref), baseCk)
				}
				nextDir := f.writeCk(next)
				res, err := f.publishDir(ctx, nextDir, o, nil)
				require.NoError(t, err)
				bw, w := f.open(base.Ref), f.open(res.Ref)
				require.NotEqual(t, base.Ref, res.Ref)
				assert.False(t, w.Full, w.FullReason)
				assert.Equal(t, bw.Number+1, w.Number)
				assert.Equal(t, base.Ref.Version, w.Base)
				assert.Equal(t, bw.Number, w.BaseNumber)
				assert.Equal(t, 1, w.DeltasSinceFull)
				m := w.V.Metrics
				assert.Equal(t, float64(len(changed)), m["changed_tensors"])
				if tc.want != "" {
					assert.Equal(t, tc.want, m["encoding"])
				}
				newDir := nextDir
				att := f.attachments(res.Ref)
				var gotChanged []string
				for _, e := range w.Entries {
					if e.Entry == records.EntryFile {
						assert.Equal(t, records.EncUnchanged, e.Encoding)
						b, err := os.ReadFile(filepath.Join(newDir, e.Name))
						require.NoError(t, err)
						assert.Equal(t, sha(b), e.Checksum, "file row %s has the new file's sha256", e.Name)
						continue
					}
					nt := next.Tensor(e.Name)
					assert.Equal(t, tensorChecksum(nt.Data), e.Checksum, e.Name)
					if e.Encoding == records.EncUnchanged {
						assert.Equal(t, tensorChecksum(ck.Tensor(e.Name).Data), e.Checksum, "unchanged %s", e.Name)
						continue
					}
					gotChanged = append(gotChanged, e.Name)
					assert.Equal(t, tc.want, e.Encoding, e.Name)
					pack := att[e.Payload]
					require.NotNil(t, pack, "pack %s of %s", e.Payload, e.Name)
					dst := append([]byte{}, ck.Tensor(e.Name).Data...)
					require.NoError(t, applyPayload(e.Encoding, dst, pack[e.PayloadOffset:e.PayloadOffset+e.PayloadSize]))
					assert.Equal(t, nt.Data, dst, "payload of %s turns the base's bytes into the new ones", e.Name)
				}
				sort.Strings(gotChanged)
				assert.Equal(t, changed, gotChanged, "exactly the changed tensors have payloads")
				var packBytes int64
				for name, b := range att {
					assert.True(t, strings.HasPrefix(name, "packs/"), "a delta stores only packs, not %s", name)
					packBytes += int64(len(b))
				}
				assert.Equal(t, float64(packBytes), m["stored_bytes"])
				if len(changed) == 0 {
					assert.Empty(t, att, "an empty delta stores nothing")
				}
				assert.Equal(t, res.Ref, f.latest())
			})
		}
	})
}

// fakePullDir makes a pull directory (docs/sync.md §2) holding base, whose
// files are those of dir, as a pull would leave it.
func fakePullDir(t *testing.T, name string, base *weightsVersion, dir string) string {
	t.Helper()
	pd := t.TempDir()
	vd := versionDirName(base.Number, base.Ref.Version)
	require.NoError(t, os.CopyFS(filepath.Join(pd, vd), os.DirFS(dir)))
	require.NoError(t, writeState(pd, localState{Format: stateFormat, Dataset: name, Version: base.Ref.Version, Number: base.Number, Dir: vd}))
	return pd
}

// TestPublishFullRules: every rule of docs/sync.md §1.1 that makes a
// version full, with full_reason saying which.
func TestPublishFullRules(t *testing.T) {
	type step func(t *testing.T, f *fixture, ck *synctest.Model) PublishOptions
	cases := []struct {
		name   string
		change step
		reason string
	}{
		{"--full", func(t *testing.T, f *fixture, ck *synctest.Model) PublishOptions {
			mutate(ck, 0.2, 1)
			return PublishOptions{Full: true}
		}, "--full"},
		{"full every 1", func(t *testing.T, f *fixture, ck *synctest.Model) PublishOptions {
			mutate(ck, 0.2, 1)
			return PublishOptions{FullEvery: 1}
		}, "--full-every 1"},
		{"config changed", func(t *testing.T, f *fixture, ck *synctest.Model) PublishOptions {
			ck.Files["config.json"] = []byte(`{"max_position_embeddings":8192}`)
			return PublishOptions{}
		}, `file "config.json"`},
		{"tensor added", func(t *testing.T, f *fixture, ck *synctest.Model) PublishOptions {
			ck.Shards[1] = append(ck.Shards[1], synctest.Tensor{Name: "extra", DType: "U8", Shape: []int64{3}, Data: []byte{1, 2, 3}})
			return PublishOptions{}
		}, "model-00002-of-00002.safetensors"},
		{"dtype changed", func(t *testing.T, f *fixture, ck *synctest.Model) PublishOptions {
			ck.Shards[0][0].DType = "I32"
			return PublishOptions{}
		}, "is I32"},
		{"shard header changed", func(t *testing.T, f *fixture, ck *synctest.Model) PublishOptions {
			// Same tensors at the same offsets; only __metadata__ differs.
			ck.Meta = map[string]string{"format": "np"}
			return PublishOptions{}
		}, "header"},
		{"base forgotten", func(t *testing.T, f *fixture, ck *synctest.Model) PublishOptions {
			mutate(ck, 0.2, 1)
			l := f.latest()
			require.NoError(t, f.st.Delete(context.Background(), l.Name+"/_v/"+l.Version+"/manifest.json"))
			return PublishOptions{}
		}, "cannot be read"},
	}
	eachStore(t, func(t *testing.T, f *fixture) {
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				f.name = fmt.Sprintf("weights/rules%d", i)
				ctx := context.Background()
				ck := synctest.Tiny(uint64(40+i), 2, 3, 200)
				_, err := f.publishDir(ctx, f.writeCk(ck), PublishOptions{}, nil)
				require.NoError(t, err)
				o := tc.change(t, f, ck)
				res, err := f.publishDir(ctx, f.writeCk(ck), o, nil)
				require.NoError(t, err)
				w := f.open(res.Ref)
				assert.True(t, w.Full)
				assert.Contains(t, w.FullReason, tc.reason)
				assert.Equal(t, int64(2), w.Number)
			})
		}
	})
}

// TestLatestForwardOnly (spec §5.1 item 3): publish A, then B, then A again:
// the rerun finds A committed and publishes nothing, and latest stays at B,
// whose number is higher.
func TestLatestForwardOnly(t *testing.T) {
	eachStore(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		a := synctest.Tiny(50, 2, 3, 200)
		b := a.Clone()
		mutate(b, 0.5, 3)
		aDir, bDir := f.writeCk(a), f.writeCk(b)
		ra, err := f.publishDir(ctx, aDir, PublishOptions{}, nil)
		require.NoError(t, err)
		rb, err := f.publishDir(ctx, bDir, PublishOptions{}, nil)
		require.NoError(t, err)
		assert.Equal(t, rb.Ref, f.latest())
		again, err := f.publishDir(ctx, aDir, PublishOptions{}, nil)
		require.NoError(t, err)
		assert.True(t, again.Existed, "an identical rerun finds its version")
		assert.Equal(t, ra.Ref, again.Ref)
		assert.Equal(t, rb.Ref, f.latest(), "latest never moves back to a lower number")
		claims, err := listClaims(ctx, f.st, f.name)
		require.NoError(t, err)
		assert.Equal(t, []int64{1, 2}, claims, "a rerun claims no number")
	})
}

// errCrash is what a test hook's cancellation looks like.
var errCrash = errors.New("crashed by the test")

// TestPublishCrash (spec §5.1 items 2 and 9): a publish stopped after k
// files of a full version, or after its packs, committed nothing (no
// manifest, latest where it was); the next publish claims a number above
// the dead one and is full, naming it; numbers are never reused.
func TestPublishCrash(t *testing.T) {
	eachStore(t, func(t *testing.T, f *fixture) {
		for _, tc := range []struct {
			name  string
			point string
			after int
			o     PublishOptions
		}{
			{"full after 2 files", HookPublishFileStored, 2, PublishOptions{Full: true, Workers: 1}},
			{"delta after its pack", HookPublishPackStored, 1, PublishOptions{}},
			{"after the claim", HookPublishClaimed, 1, PublishOptions{}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f.name = "weights/crash-" + strings.ReplaceAll(tc.name, " ", "-")
				bg := context.Background()
				ck := synctest.Tiny(60, 3, 3, 200)
				first, err := f.publishDir(bg, f.writeCk(ck), PublishOptions{}, nil)
				require.NoError(t, err)
				before := f.committed()

				mutate(ck, 0.5, 9)
				ctx, cancel := context.WithCancelCause(bg)
				var mu gosync.Mutex
				n := 0
				hook := func(p string) {
					mu.Lock()
					defer mu.Unlock()
					if p == tc.point {
						if n++; n == tc.after {
							cancel(errCrash)
						}
					}
				}
				crashDir := f.writeCk(ck)
				_, err = f.publishDir(ctx, crashDir, tc.o, hook)
				require.Error(t, err, "the publish stopped")
				assert.Equal(t, before, f.committed(), "no manifest: nothing resolvable")
				assert.Equal(t, first.Ref, f.latest())

				mutate(ck, 0.5, 10)
				res, err := f.publishDir(bg, f.writeCk(ck), PublishOptions{}, nil)
				require.NoError(t, err)
				w := f.open(res.Ref)
				assert.Equal(t, int64(3), w.Number, "above every claim")
				assert.True(t, w.Full)
				assert.Contains(t, w.FullReason, "weights number 2 was claimed")
				assert.Equal(t, res.Ref, f.latest())

				// The crashed checkpoint, rerun, gets a new number too.
				res, err = f.publishDir(bg, crashDir, PublishOptions{}, nil)
				require.NoError(t, err)
				assert.Equal(t, int64(4), f.open(res.Ref).Number)
			})
		}
	})
}

// TestPublishRace: publishers racing on one name, some with the same
// checkpoint, end with one version per checkpoint, distinct numbers, and
// latest at the highest committed number.
func TestPublishRace(t *testing.T) {
	eachStore(t, func(t *testing.T, f *fixture) {
		ctx := context.Background()
		base := synctest.Tiny(70, 2, 3, 200)
		_, err := f.publishDir(ctx, f.writeCk(base), PublishOptions{}, nil)
		require.NoError(t, err)
		var dirs []string
		for i := range 3 {
			ck := base.Clone()
			mutate(ck, 0.5, uint64(100+i))
			d := f.writeCk(ck)
			dirs = append(dirs, d, d) // two publishers per checkpoint
		}
		results := make([]dataset.Result, len(dirs))
		var wg gosync.WaitGroup
		errs := make([]error, len(dirs))
		for i, d := range dirs {
			wg.Go(func() {
				results[i], errs[i] = f.publishDir(ctx, d, PublishOptions{Workers: 2}, nil)
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		assert.Len(t, f.committed(), 4, "the base and one version per checkpoint")
		numbers := map[int64]dataset.Ref{}
		var top int64
		for i := 0; i < len(dirs); i += 2 {
			assert.Equal(t, results[i].Ref, results[i+1].Ref, "the same checkpoint is one version")
			w := f.open(results[i].Ref)
			_, dup := numbers[w.Number]
			assert.False(t, dup, "number %d given twice", w.Number)
			numbers[w.Number] = w.Ref
			top = max(top, w.Number)
		}
		assert.Equal(t, numbers[top], f.latest(), "latest at the highest number")
		claims, err := listClaims(ctx, f.st, f.name)
		require.NoError(t, err)
		assert.Len(t, claims, 1+len(dirs), "every publisher claimed its own number")
	})
}

// TestPublishBadInput: a missing index or shard, a tensor whose bytes
// disagree with its header: exit 5 naming the file, no number claimed,
// nothing committed.
func TestPublishBadInput(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(t *testing.T, dir string, ck *synctest.Model)
		names  string
	}{
		{"missing index", func(t *testing.T, dir string, ck *synctest.Model) {
			require.NoError(t, os.Remove(filepath.Join(dir, "model.safetensors.index.json")))
		}, "model.safetensors.index.json"},
		{"missing shard", func(t *testing.T, dir string, ck *synctest.Model) {
			require.NoError(t, os.Remove(filepath.Join(dir, ck.ShardName(1))))
		}, "model-00002-of-00002.safetensors"},
		{"tensor bytes disagree with header", func(t *testing.T, dir string, ck *synctest.Model) {
			ck.Shards[0][1].Data = ck.Shards[0][1].Data[:len(ck.Shards[0][1].Data)-2]
			require.NoError(t, ck.Write(dir))
		}, "model-00001-of-00002.safetensors"},
		{"truncated shard", func(t *testing.T, dir string, ck *synctest.Model) {
			p := filepath.Join(dir, ck.ShardName(0))
			fi, err := os.Stat(p)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(p, fi.Size()-3))
		}, "model-00001-of-00002.safetensors"},
	}
	eachStore(t, func(t *testing.T, f *fixture) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				ck := synctest.Tiny(80, 2, 3, 200)
				dir := f.writeCk(ck)
				tc.break_(t, dir, ck)
				_, err := f.publishDir(context.Background(), dir, PublishOptions{}, nil)
				require.Error(t, err)
				assert.Equal(t, stagecmd.ExitBadInput, stagecmd.ExitCode(err), "%v", err)
				assert.Contains(t, err.Error(), tc.names)
				assert.Empty(t, f.committed())
				claims, err := listClaims(context.Background(), f.st, f.name)
				require.NoError(t, err)
				assert.Empty(t, claims, "no number claimed for a bad checkpoint")
			})
		}
	})
}
