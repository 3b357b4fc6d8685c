package sync

import (
	"encoding/binary"
	"fmt"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/xxh3"

	"github.com/kilnrl/kiln/formats/records"
)

// tensorChecksum is a tensor's checksum (docs/sync.md §1.1): xxh3-128 of
// its raw bytes as 32 lowercase hex digits, the high 64 bits first, as the
// reference renders an xxh3-128 hexdigest.
func tensorChecksum(b []byte) string {
	h := xxh3.Hash128(b)
	return fmt.Sprintf("%016x%016x", h.Hi, h.Lo)
}

// maxOverwriteTensor bounds the tensors the overwrite encoding can carry:
// its byte positions are u32 (docs/sync.md §1.1).
const maxOverwriteTensor = 1 << 32

// codec compresses and decompresses delta payloads (one zstd frame each,
// level 1). Its encoder and decoder are reused across tensors and are safe
// for concurrent use (EncodeAll/DecodeAll), so one codec serves every
// worker of a publish or pull. Close releases them.
type codec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

func newCodec() (*codec, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithZeroFrames(true))
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	// The decoder's own limit is a backstop; applyPayload bounds each
	// frame by the tensor it applies to before decoding it.
	dec, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(1<<36))
	if err != nil {
		enc.Close()
		return nil, fmt.Errorf("zstd decoder: %w", err)
	}
	return &codec{enc: enc, dec: dec}, nil
}

func (c *codec) Close() {
	c.enc.Close()
	c.dec.Close()
}

// encode returns one zstd frame of the payload that turns old into new
// under encoding enc (docs/sync.md §1.1): xor (new XOR old), overwrite
// (LE u32 count K, K LE u32 positions, the K new bytes) or replace (new;
// old is not read). xor and overwrite need old and new of one length, and
// overwrite a tensor under 4 GiB.
func (c *codec) encode(enc string, old, new []byte) ([]byte, error) {
	var payload []byte
	switch enc {
	case records.EncReplace:
		payload = new
	case records.EncXOR:
		if len(old) != len(new) {
			return nil, fmt.Errorf("xor payload: base has %d bytes, new %d: a delta needs equal lengths", len(old), len(new))
		}
		payload = make([]byte, len(new))
		for i := range new {
			payload[i] = new[i] ^ old[i]
		}
	case records.EncOverwrite:
		if len(old) != len(new) {
			return nil, fmt.Errorf("overwrite payload: base has %d bytes, new %d: a delta needs equal lengths", len(old), len(new))
		}
		if len(new) >= maxOverwriteTensor {
			return nil, fmt.Errorf("overwrite payload: a tensor of %d bytes is 4 GiB or more (u32 positions): use xor or replace", len(new))
		}
		var pos []uint32
		for i := range new {
			if new[i] != old[i] {
				pos = append(pos, uint32(i))
			}
		}
		payload = make([]byte, 4+5*len(pos))
		binary.LittleEndian.PutUint32(payload, uint32(len(pos)))
		vals := payload[4+4*len(pos):]
		for j, p := range pos {
			binary.LittleEndian.PutUint32(payload[4+4*j:], p)
			vals[j] = new[p]
		}
	default:
		return nil, fmt.Errorf("unknown delta encoding %q (want %s, %s or %s)", enc, records.EncXOR, records.EncOverwrite, records.EncReplace)
	}
	// Sized for the worst case up front: weights barely compress, and a
	// buffer grown by append holds the old and the new copy at once —
	// about twice a tensor at the publish's peak memory.
	return c.enc.EncodeAll(payload, make([]byte, 0, c.enc.MaxEncodedSize(len(payload)))), nil
}

// apply decodes frame and applies it to dst, which holds the base's bytes
// (unused for replace) and on success holds the new ones. A frame that is
// not zstd, a payload of the wrong length for dst, or a position out of
// range is an error, and then dst is unchanged.
func (c *codec) apply(enc string, dst []byte, frame []byte) error {
	n := len(dst)
	var limit int
	switch enc {
	case records.EncXOR, records.EncReplace:
		limit = n
	case records.EncOverwrite:
		limit = 4 + 5*n
	default:
		return fmt.Errorf("unknown delta encoding %q (want %s, %s or %s)", enc, records.EncXOR, records.EncOverwrite, records.EncReplace)
	}
	var hdr zstd.Header
	if err := hdr.Decode(frame); err != nil {
		return fmt.Errorf("%s payload: not a zstd frame: %w", enc, err)
	}
	if hdr.HasFCS && hdr.FrameContentSize > uint64(limit) {
		return fmt.Errorf("%s payload: %d bytes, more than a tensor of %d bytes can take", enc, hdr.FrameContentSize, n)
	}
	payload, err := c.dec.DecodeAll(frame, make([]byte, 0, limit))
	if err != nil {
		return fmt.Errorf("%s payload: %w", enc, err)
	}
	switch enc {
	case records.EncReplace:
		if len(payload) != n {
			return fmt.Errorf("replace payload: %d bytes for a tensor of %d", len(payload), n)
		}
		copy(dst, payload)
	case records.EncXOR:
		if len(payload) != n {
			return fmt.Errorf("xor payload: %d bytes for a tensor of %d", len(payload), n)
		}
		for i, b := range payload {
			dst[i] ^= b
		}
	case records.EncOverwrite:
		if len(payload) < 4 {
			return fmt.Errorf("overwrite payload: %d bytes, shorter than its count", len(payload))
		}
		k := int(binary.LittleEndian.Uint32(payload))
		if k > n || len(payload) != 4+5*k {
			return fmt.Errorf("overwrite payload: %d bytes for a count of %d positions in a tensor of %d bytes", len(payload), k, n)
		}
		pos, vals := payload[4:4+4*k], payload[4+4*k:]
		for j := 0; j < k; j++ {
			if p := binary.LittleEndian.Uint32(pos[4*j:]); int64(p) >= int64(n) {
				return fmt.Errorf("overwrite payload: position %d out of a tensor of %d bytes", p, n)
			}
		}
		for j := 0; j < k; j++ {
			dst[binary.LittleEndian.Uint32(pos[4*j:])] = vals[j]
		}
	}
	return nil
}
