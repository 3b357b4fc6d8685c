package train

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
)

// ReadSafetensors parses a safetensors file written by WriteSafetensors
// (1-D tensors of the four dtypes) back into tensors by name and the
// metadata.
func ReadSafetensors(data []byte) (map[string]any, map[string]string, error) {
	if len(data) < 8 {
		return nil, nil, fmt.Errorf("safetensors: %d bytes, shorter than the header length", len(data))
	}
	n := binary.LittleEndian.Uint64(data[:8])
	if n > uint64(len(data)-8) {
		return nil, nil, fmt.Errorf("safetensors: header length %d beyond the file's %d bytes", n, len(data))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &raw); err != nil {
		return nil, nil, fmt.Errorf("safetensors header: %w", err)
	}
	body := data[8+n:]
	out := map[string]any{}
	var meta map[string]string
	for name, r := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(r, &meta); err != nil {
				return nil, nil, fmt.Errorf("safetensors metadata: %w", err)
			}
			continue
		}
		var ti tensorInfo
		if err := json.Unmarshal(r, &ti); err != nil {
			return nil, nil, fmt.Errorf("safetensors tensor %q: %w", name, err)
		}
		lo, hi := ti.DataOffsets[0], ti.DataOffsets[1]
		if lo < 0 || hi < lo || hi > int64(len(body)) || len(ti.Shape) != 1 {
			return nil, nil, fmt.Errorf("safetensors tensor %q: bad range %v or shape %v", name, ti.DataOffsets, ti.Shape)
		}
		b := body[lo:hi]
		switch ti.DType {
		case "I32", "F32":
			if len(b) != 4*ti.Shape[0] {
				return nil, nil, fmt.Errorf("safetensors tensor %q: %d bytes for shape %v", name, len(b), ti.Shape)
			}
			if ti.DType == "I32" {
				v := make([]int32, ti.Shape[0])
				for i := range v {
					v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
				}
				out[name] = v
			} else {
				v := make([]float32, ti.Shape[0])
				for i := range v {
					v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
				}
				out[name] = v
			}
		case "I64":
			if len(b) != 8*ti.Shape[0] {
				return nil, nil, fmt.Errorf("safetensors tensor %q: %d bytes for shape %v", name, len(b), ti.Shape)
			}
			v := make([]int64, ti.Shape[0])
			for i := range v {
				v[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
			}
			out[name] = v
		case "U8":
			out[name] = append([]uint8{}, b...)
		default:
			return nil, nil, fmt.Errorf("safetensors tensor %q: dtype %q", name, ti.DType)
		}
	}
	return out, meta, nil
}
