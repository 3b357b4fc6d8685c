package enginetest

import (
	"encoding/json"
	"net/http"

	"github.com/kilnrl/kiln/internal/ojson"
)

const untrustedTemplateMsg = "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template."

// handleTokenize serves POST /tokenize (docs/engine-wire.md §2): the completion
// form (prompt) and the chat form (messages). add_special_tokens is
// accepted and has no effect (the tokenizer adds no BOS, like Qwen3's).
// There is no length check, as in vLLM.
func (e *Engine) handleTokenize(w http.ResponseWriter, body []byte) {
	m, ok := e.readRequest(w, body)
	if !ok {
		return
	}
	var retStrs bool
	if raw, ok := m["return_token_strs"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &retStrs); err != nil {
			writeError(w, schemaError("return_token_strs", "return_token_strs: Input should be a valid boolean"))
			return
		}
	}
	var ids []int
	if rawMsgs, ok := m["messages"]; ok {
		addGen, contFinal := true, false
		for key, dst := range map[string]*bool{"add_generation_prompt": &addGen, "continue_final_message": &contFinal} {
			if raw, ok := m[key]; ok && string(raw) != "null" {
				if err := json.Unmarshal(raw, dst); err != nil {
					writeError(w, schemaError(key, "%s: Input should be a valid boolean", key))
					return
				}
			}
		}
		if raw, ok := m["chat_template"]; ok && string(raw) != "null" {
			writeError(w, badRequest(untrustedTemplateMsg))
			return
		}
		kw, err := kwargsFromJSON(m["chat_template_kwargs"])
		if err != nil {
			writeError(w, schemaError("chat_template_kwargs", "%v", err))
			return
		}
		if _, ok := kw["chat_template"]; ok {
			writeError(w, badRequest(untrustedTemplateMsg))
			return
		}
		text, err := e.opts.Template.Render(rawMsgs, m["tools"], RenderOptions{AddGenerationPrompt: addGen, ContinueFinalMessage: contFinal, Kwargs: kw})
		if err != nil {
			writeError(w, badRequest("%v", err))
			return
		}
		ids = Encode(text)
	} else {
		raw, ok := m["prompt"]
		var prompt string
		if !ok || json.Unmarshal(raw, &prompt) != nil {
			writeError(w, schemaError("prompt", "1 validation error:\n  prompt: Field required (a string)"))
			return
		}
		ids = Encode(prompt)
	}
	var strs any
	if retStrs {
		s := make([]string, len(ids))
		for i, id := range ids {
			s[i] = TokenPiece(id)
		}
		strs = s
	}
	writeJSONResponse(w, 200, ojson.Obj("count", len(ids), "max_model_len", e.opts.MaxModelLen, "tokens", ids, "token_strs", strs))
}

// handleDetokenize serves POST /detokenize (docs/engine-wire.md §3): special tokens are kept;
// a negative or out-of-vocabulary id is a 400 (the latter is this engine's
// choice, upstream behaviour depends on the tokenizer).
func (e *Engine) handleDetokenize(w http.ResponseWriter, body []byte) {
	m, ok := e.readRequest(w, body)
	if !ok {
		return
	}
	ids, ok := intList(m["tokens"])
	if !ok || ids == nil {
		writeError(w, schemaError("tokens", "1 validation error:\n  tokens: Field required (a list of integers)"))
		return
	}
	if aerr := idsError("tokens", ids); aerr != nil {
		writeError(w, aerr)
		return
	}
	writeJSONResponse(w, 200, ojson.Obj("prompt", Decode(ids)))
}
