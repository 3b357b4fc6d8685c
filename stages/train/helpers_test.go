package train

import "encoding/json"

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func asFloats(v any) []float64 {
	var out []float64
	switch d := v.(type) {
	case []int32:
		for _, x := range d {
			out = append(out, float64(x))
		}
	case []int64:
		for _, x := range d {
			out = append(out, float64(x))
		}
	case []uint8:
		for _, x := range d {
			out = append(out, float64(x))
		}
	case []float32:
		for _, x := range d {
			out = append(out, float64(x))
		}
	}
	if out == nil {
		out = []float64{}
	}
	return out
}
