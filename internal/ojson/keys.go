package ojson

// common returns the constant for a frequent key or string value of the
// three request protocols — field names, roles, block and item types,
// schema types — which every message repeats (raw is the text as sent,
// without escapes), so that those are not allocated.
func common(raw []byte) (string, bool) {
	if len(raw) > len("additionalProperties") {
		return "", false
	}
	switch string(raw) {
	case "role":
		return "role", true
	case "content":
		return "content", true
	case "type":
		return "type", true
	case "text":
		return "text", true
	case "id":
		return "id", true
	case "name":
		return "name", true
	case "input":
		return "input", true
	case "tool_use_id":
		return "tool_use_id", true
	case "cache_control":
		return "cache_control", true
	case "thinking":
		return "thinking", true
	case "signature":
		return "signature", true
	case "arguments":
		return "arguments", true
	case "call_id":
		return "call_id", true
	case "output":
		return "output", true
	case "tool_calls":
		return "tool_calls", true
	case "tool_call_id":
		return "tool_call_id", true
	case "function":
		return "function", true
	case "description":
		return "description", true
	case "properties":
		return "properties", true
	case "required":
		return "required", true
	case "is_error":
		return "is_error", true
	case "model":
		return "model", true
	case "messages":
		return "messages", true
	case "system":
		return "system", true
	case "tools":
		return "tools", true
	case "metadata":
		return "metadata", true
	case "max_tokens":
		return "max_tokens", true
	case "stream":
		return "stream", true
	case "temperature":
		return "temperature", true
	case "top_p":
		return "top_p", true
	case "top_k":
		return "top_k", true
	case "tool_choice":
		return "tool_choice", true
	case "user_id":
		return "user_id", true
	case "budget_tokens":
		return "budget_tokens", true
	case "effort":
		return "effort", true
	case "output_config":
		return "output_config", true
	case "context_management":
		return "context_management", true
	case "input_schema":
		return "input_schema", true
	case "status":
		return "status", true
	case "summary":
		return "summary", true
	case "encrypted_content":
		return "encrypted_content", true
	case "instructions":
		return "instructions", true
	case "store":
		return "store", true
	case "include":
		return "include", true
	case "parallel_tool_calls":
		return "parallel_tool_calls", true
	case "strict":
		return "strict", true
	case "parameters":
		return "parameters", true
	case "additionalProperties":
		return "additionalProperties", true
	case "items":
		return "items", true
	case "enum":
		return "enum", true
	case "stop_sequences":
		return "stop_sequences", true
	case "edits":
		return "edits", true
	case "keep":
		return "keep", true
	case "display":
		return "display", true
	case "max_output_tokens":
		return "max_output_tokens", true
	case "reasoning":
		return "reasoning", true
	case "user":
		return "user", true
	case "assistant":
		return "assistant", true
	case "developer":
		return "developer", true
	case "tool":
		return "tool", true
	case "tool_use":
		return "tool_use", true
	case "tool_result":
		return "tool_result", true
	case "function_call":
		return "function_call", true
	case "function_call_output":
		return "function_call_output", true
	case "message":
		return "message", true
	case "input_text":
		return "input_text", true
	case "output_text":
		return "output_text", true
	case "summary_text":
		return "summary_text", true
	case "object":
		return "object", true
	case "string":
		return "string", true
	case "ephemeral":
		return "ephemeral", true
	case "completed":
		return "completed", true
	}
	return "", false
}
