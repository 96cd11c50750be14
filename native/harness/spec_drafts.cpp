// spec_drafts: the drafts llama.cpp's own common_speculative proposes at each step of a greedy
// generation, printed as JSON, for comparing FlashDesk's draft sources with it: draft-simple (a
// classic draft model), draft-dflash (a DFlash v1 or DFlash2 drafter), draft-dspark, draft-eagle3, or draft-mtp (the
// target's own MTP head: no --draft; an MTP context on the target file, loaded with its heads), the
// last three fed the target's states through `common_speculative_process` after every target
// decode, as llama-server does.
// Built by native.harness against the pinned, patched tree's libllama + libllama-common.
//
//   spec-drafts --target T.gguf [--draft D.gguf] --tokens 1,2,3 [--type simple|dflash|dspark|eagle3|mtp] [--n-max 3]
//               [--n-min 0] [--p-min 0] [--max-tokens 32] [--n-ctx 512] [--threads 2]
//
// The loop is examples/speculative-simple's, with two choices that mirror FlashDesk's loop: the
// target's pick is the argmax of its logits (greedy acceptance), and a step whose room for drafts
// is 0 does not draft (draft-simple reads a per-step n_max of 0 as "no limit").
#include "common.h"
#include "llama.h"
#include "speculative.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static llama_token argmax(llama_context * ctx, int32_t i, int32_t n_vocab) {
    const float * row = llama_get_logits_ith(ctx, i);
    return (llama_token) (std::max_element(row, row + n_vocab) - row);
}

static std::string ids_json(const std::vector<llama_token> & ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        s += (i ? "," : "") + std::to_string(ids[i]);
    }
    return s + "]";
}

int main(int argc, char ** argv) {
    std::string path_tgt, path_dft, tokens_arg, type = "simple";
    int n_max = 3, n_min = 0, max_tokens = 32, n_ctx = 512, n_threads = 2;
    float p_min = 0.0f;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if      (k == "--target")     path_tgt   = v;
        else if (k == "--draft")      path_dft   = v;
        else if (k == "--tokens")     tokens_arg = v;
        else if (k == "--type")       type       = v;
        else if (k == "--n-max")      n_max      = std::atoi(v.c_str());
        else if (k == "--n-min")      n_min      = std::atoi(v.c_str());
        else if (k == "--p-min")      p_min      = std::strtof(v.c_str(), nullptr);
        else if (k == "--max-tokens") max_tokens = std::atoi(v.c_str());
        else if (k == "--n-ctx")      n_ctx      = std::atoi(v.c_str());
        else if (k == "--threads")    n_threads  = std::atoi(v.c_str());
        else { fprintf(stderr, "unknown argument %s\n", k.c_str()); return 2; }
    }
    std::vector<llama_token> inp;
    for (const char * p = tokens_arg.c_str(); *p; ) {
        char * end;
        inp.push_back((llama_token) std::strtol(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) { fprintf(stderr, "bad --tokens\n"); return 2; }
    }
    const bool mtp = type == "mtp";  // the target's own head: an MTP context on the target file
    if (path_tgt.empty() || (path_dft.empty() && !mtp) || inp.size() < 2) {
        fprintf(stderr, "need --target, --draft (but for --type mtp) and --tokens (2 or more)\n");
        return 2;
    }

    ggml_backend_load_all();  // the CPU backend variants are loadable modules (GGML_BACKEND_DL)
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.load_mtp = mtp;  // as llama-server loads a target for draft-mtp
    llama_model * model_tgt = llama_model_load_from_file(path_tgt.c_str(), mp);
    llama_model * model_dft = mtp ? model_tgt : llama_model_load_from_file(path_dft.c_str(), mp);
    if (!model_tgt || !model_dft) { fprintf(stderr, "failed to load the models\n"); return 1; }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = n_threads;
    const bool fed = type == "dflash" || type == "dspark" || type == "eagle3" || mtp;  // fed the target's states
    if (type != "simple" && !fed) { fprintf(stderr, "--type is simple, dflash, dspark, eagle3 or mtp\n"); return 2; }
    llama_context_params cpt = cp;
    cpt.n_rs_seq = n_max + 1;  // a recurrent target takes back rejected drafts from snapshots
    llama_context * ctx_tgt = llama_init_from_model(model_tgt, cpt);
    llama_context_params cpd = cp;
    if (fed) cpd.ctx_other = ctx_tgt;  // the drafter shares the target's embeddings and head
    if (mtp) cpd.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    llama_context * ctx_dft = llama_init_from_model(model_dft, cpd);
    if (!ctx_tgt || !ctx_dft) { fprintf(stderr, "failed to create the contexts\n"); return 1; }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model_tgt));

    common_params_speculative sp;
    sp.types = { type == "dflash" ? COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH
               : type == "dspark" ? COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK
               : type == "eagle3" ? COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3
               : mtp ? COMMON_SPECULATIVE_TYPE_DRAFT_MTP : COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE };
    sp.draft.backend_sampling = false;  // drafts read on the CPU, as FlashDesk reads them
    sp.draft.n_max = n_max;
    sp.draft.n_min = n_min;
    sp.draft.p_min = p_min;
    sp.draft.ctx_tgt = ctx_tgt;
    sp.draft.ctx_dft = ctx_dft;
    common_speculative * spec = common_speculative_init(sp, 1);
    if (!spec) { fprintf(stderr, "failed to initialise draft-%s\n", type.c_str()); return 1; }

    const llama_seq_id seq = 0;
    {   // the prompt but its last token, into the target and (through the speculator) the draft
        common_batch b(ctx_tgt);
        for (size_t i = 0; i + 1 < inp.size(); ++i) b.add(inp[i], (llama_pos) i, seq, false);
        if (llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, b.get()) != 0 || !common_speculative_process(spec, b)) {
            fprintf(stderr, "prompt decode failed\n");
            return 1;
        }
    }
    llama_tokens history(inp.begin(), inp.end() - 1);
    llama_token id_last = inp.back();
    int n_past = (int) inp.size() - 1;
    common_speculative_begin(spec, seq, history);

    std::vector<llama_token> out;
    std::string steps;
    common_batch batch(ctx_tgt);
    while ((int) out.size() < max_tokens) {
        const int room = std::min(max_tokens - (int) out.size(), n_ctx - n_past) - 1;
        llama_tokens draft;
        if (room > 0) {
            common_speculative_get_draft_params(spec, seq) = { true, room, n_past, id_last, &history, &draft };
            common_speculative_draft(spec);
            llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, n_past, -1);  // its own draft passes
        }
        batch.clear();
        batch.add(id_last, n_past, seq, true);
        for (size_t i = 0; i < draft.size(); ++i) batch.add(draft[i], n_past + 1 + (int) i, seq, true);
        if (llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch.get()) != 0 || !common_speculative_process(spec, batch)) {
            fprintf(stderr, "verify decode failed\n");
            return 1;
        }
        std::vector<llama_token> ids;  // greedy acceptance: the target's argmax after each verified token
        for (size_t i = 0; i <= draft.size(); ++i) {
            ids.push_back(argmax(ctx_tgt, (int32_t) i, n_vocab));
            if (i == draft.size() || ids.back() != draft[i]) break;
        }
        common_speculative_accept(spec, seq, (uint16_t) (ids.size() - 1));
        steps += std::string(steps.empty() ? "" : ",") + "{\"n_past\":" + std::to_string(n_past) +
                 ",\"anchor\":" + std::to_string(id_last) + ",\"drafts\":" + ids_json(draft) +
                 ",\"emitted\":" + ids_json(ids) + "}";
        bool eog = false;
        for (llama_token t : ids) {
            history.push_back(id_last);
            id_last = t;
            out.push_back(t);
            if (llama_vocab_is_eog(llama_model_get_vocab(model_tgt), t) || (int) out.size() >= max_tokens) { eog = true; break; }
        }
        n_past += (int) ids.size();
        llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq, n_past, -1);
        llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, n_past, -1);
        if (eog) break;
    }
    printf("{\"type\":\"%s\",\"n_max\":%d,\"n_min\":%d,\"p_min\":%g,\"steps\":[%s],\"output\":%s}\n",
           type.c_str(), n_max, n_min, p_min, steps.c_str(), ids_json(out).c_str());

    common_speculative_free(spec);
    llama_free(ctx_dft);
    llama_free(ctx_tgt);
    if (model_dft != model_tgt) llama_model_free(model_dft);
    llama_model_free(model_tgt);
    llama_backend_free();
    return 0;
}
