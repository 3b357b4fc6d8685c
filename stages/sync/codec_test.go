package sync

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"

	"github.com/kilnrl/kiln/formats/records"
)

// TestTensorChecksum pins the rendering: xxh3-128 as 32 lowercase hex
// digits, high 64 bits first (the reference's hexdigest; the empty input's
// XXH3-128 is 99aa06d3014798d86001c324468d497f), and the streaming hasher
// publish uses agrees with the one-shot one.
func TestTensorChecksum(t *testing.T) {
	assert.Equal(t, "99aa06d3014798d86001c324468d497f", tensorChecksum(nil))
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 16, 17, 128, 129, 240, 241, 1000, 1 << 16} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		h := xxh3.New()
		for off := 0; off < n; off += 7 {
			h.Write(b[off:min(off+7, n)])
		}
		s := h.Sum128()
		sum := tensorChecksum(b)
		assert.Len(t, sum, 32)
		assert.Equal(t, sum, hexOf(s.Hi, s.Lo), "n=%d", n)
	}
}

func hexOf(hi, lo uint64) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo)
	const digits = "0123456789abcdef"
	out := make([]byte, 32)
	for i, c := range b {
		out[2*i], out[2*i+1] = digits[c>>4], digits[c&15]
	}
	return string(out)
}

func TestCodecRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	rnd := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		return b
	}
	old := rnd(4096)
	sparse := append([]byte(nil), old...)
	for i := 0; i < len(sparse); i += 97 {
		sparse[i]++
	}
	cases := []struct {
		name     string
		old, new []byte
	}{
		{"empty", nil, nil},
		{"identical", old, old},
		{"sparse", old, sparse},
		{"dense", old, rnd(4096)},
		{"one byte", []byte{1}, []byte{2}},
	}
	c, err := newCodec()
	require.NoError(t, err)
	defer c.Close()
	for _, tc := range cases {
		for _, enc := range []string{records.EncXOR, records.EncOverwrite, records.EncReplace} {
			t.Run(tc.name+"/"+enc, func(t *testing.T) {
				frame, err := c.encode(enc, tc.old, tc.new)
				require.NoError(t, err)
				dst := append([]byte{}, tc.old...)
				require.NoError(t, c.apply(enc, dst, frame))
				assert.True(t, bytes.Equal(tc.new, dst), "apply(encode(old, new)) == new")
				if enc != records.EncXOR {
					// overwrite and replace apply idempotently.
					require.NoError(t, c.apply(enc, dst, frame))
					assert.True(t, bytes.Equal(tc.new, dst))
				}
			})
		}
	}
	// The free functions are the same codec.
	frame, err := encodePayload(records.EncXOR, old, sparse)
	require.NoError(t, err)
	dst := append([]byte{}, old...)
	require.NoError(t, applyPayload(records.EncXOR, dst, frame))
	assert.Equal(t, sparse, dst)
}

// TestCodecRefuses: a payload that does not fit its tensor is an error and
// leaves the destination as it was.
func TestCodecRefuses(t *testing.T) {
	c, err := newCodec()
	require.NoError(t, err)
	defer c.Close()
	old := []byte("0123456789")
	z := func(payload []byte) []byte { return c.enc.EncodeAll(payload, nil) }
	overwrite := func(k uint32, pos []uint32, vals []byte) []byte {
		b := binary.LittleEndian.AppendUint32(nil, k)
		for _, p := range pos {
			b = binary.LittleEndian.AppendUint32(b, p)
		}
		return z(append(b, vals...))
	}
	cases := []struct {
		name, enc string
		frame     []byte
	}{
		{"xor short", records.EncXOR, z([]byte("abc"))},
		{"xor long", records.EncXOR, z(make([]byte, 11))},
		{"replace short", records.EncReplace, z([]byte("abc"))},
		{"not zstd", records.EncReplace, []byte("plainly not a frame")},
		{"truncated frame", records.EncReplace, z([]byte("abcdefghij"))[:8]},
		{"overwrite out of range", records.EncOverwrite, overwrite(2, []uint32{1, 10}, []byte("xy"))},
		{"overwrite count too high", records.EncOverwrite, overwrite(3, []uint32{1, 2}, []byte("xy"))},
		{"overwrite no count", records.EncOverwrite, z([]byte{1, 2})},
		{"unknown encoding", "rot13", z([]byte("0123456789"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := append([]byte{}, old...)
			assert.Error(t, c.apply(tc.enc, dst, tc.frame))
			assert.Equal(t, old, dst, "an error mutates nothing")
		})
	}
	_, err = c.encode(records.EncXOR, []byte("ab"), []byte("abc"))
	assert.Error(t, err, "xor needs equal lengths")
	_, err = c.encode(records.EncOverwrite, []byte("ab"), []byte("abc"))
	assert.Error(t, err, "overwrite needs equal lengths")
}

// FuzzCodec: apply(encode(old, new)) == new for every encoding, and
// applying an arbitrary frame either fails without touching dst or leaves
// a dst of the same length.
func FuzzCodec(f *testing.F) {
	f.Add([]byte("hello world"), []byte("hellO worlD"), []byte{})
	f.Add([]byte{}, []byte{}, []byte{0x28, 0xb5, 0x2f, 0xfd})
	f.Add([]byte{0, 0, 0, 0}, []byte{1, 0, 0, 1}, []byte("junk"))
	c, err := newCodec()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(c.Close)
	f.Fuzz(func(t *testing.T, old, new, junk []byte) {
		if len(new) > len(old) {
			new = new[:len(old)]
		} else {
			new = append(append([]byte{}, new...), old[len(new):]...)
		}
		for _, enc := range []string{records.EncXOR, records.EncOverwrite, records.EncReplace} {
			frame, err := c.encode(enc, old, new)
			if err != nil {
				t.Fatal(err)
			}
			dst := append([]byte{}, old...)
			if err := c.apply(enc, dst, frame); err != nil {
				t.Fatalf("%s: %v", enc, err)
			}
			if !bytes.Equal(dst, new) {
				t.Fatalf("%s: apply(encode(old, new)) != new", enc)
			}
			dst = append([]byte{}, old...)
			if err := c.apply(enc, dst, junk); err != nil && !bytes.Equal(dst, old) {
				t.Fatalf("%s: a failed apply changed dst", enc)
			}
		}
	})
}
