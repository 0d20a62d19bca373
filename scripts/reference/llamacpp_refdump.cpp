// Dump reference data from llama.cpp (libllama) for a GGUF model.
//
// Build against a llama.cpp build tree (see tests/fixtures/llamacpp/README.md):
//   g++ -O2 -std=c++17 llamacpp_refdump.cpp -I<llama.cpp>/include -I<llama.cpp>/ggml/include \
//       <build>/src/libllama.a <build>/ggml/src/libggml.a <build>/ggml/src/libggml-cpu.a \
//       <build>/ggml/src/libggml-base.a -fopenmp -lpthread -ldl -o llamacpp-refdump
//
// Modes (all settings fixed for exactness: flash attention off, f32 KV cache, no weight
// repacking / extra buffer types, fixed thread count, everything on the CPU):
//
//   llamacpp-refdump tokenize MODEL TEXTS
//       TEXTS holds records "<n bytes>\n<bytes>\n". For each record prints
//       "plain <k> id..." (add_special=true, parse_special=false) and
//       "special <k> id..." (add_special=true, parse_special=true).
//
//   llamacpp-refdump gen MODEL PROMPT_FILE N_GEN TOP_K THREADS
//       Tokenizes the prompt file's bytes (add_special=true, parse_special=true), decodes the
//       prompt in one batch, then generates N_GEN tokens greedily (argmax, lowest id on ties,
//       end-of-generation tokens do not stop it). Prints
//         "prompt <k> id..."
//         "step <i> <chosen> <id>:<logit> ... (TOP_K pairs, best first)"   incremental decode
//         "tf <i> <argmax> <id>:<logit> ..."  the same positions from ONE batched forward of
//                                              prompt + generated[0..N_GEN-2] (teacher forced)
//       Logits are printed with %.9g (exact float round trip).
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static std::string read_file(const char * path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) { fprintf(stderr, "cannot read %s\n", path); exit(1); }
    std::stringstream ss; ss << f.rdbuf(); return ss.str();
}

static std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool add_special, bool parse_special) {
    int n = -llama_tokenize(vocab, text.data(), (int32_t) text.size(), nullptr, 0, add_special, parse_special);
    if (n < 0) n = -n;
    std::vector<llama_token> out(n + 8);
    int k = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_special, parse_special);
    if (k < 0) { fprintf(stderr, "tokenize failed\n"); exit(1); }
    out.resize(k);
    return out;
}

static void print_ids(const char * tag, const std::vector<llama_token> & ids) {
    printf("%s %zu", tag, ids.size());
    for (auto t : ids) printf(" %d", t);
    printf("\n");
}

static void print_topk(const char * tag, int i, const float * logits, int n_vocab, int k) {
    std::vector<int> idx(n_vocab);
    for (int j = 0; j < n_vocab; j++) idx[j] = j;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    printf("%s %d %d", tag, i, idx[0]);
    for (int j = 0; j < k; j++) printf(" %d:%.9g", idx[j], logits[idx[j]]);
    printf("\n");
}

static int argmax(const float * logits, int n_vocab) {
    int best = 0;
    for (int j = 1; j < n_vocab; j++) if (logits[j] > logits[best]) best = j;
    return best;
}

static llama_model * load(const char * path) {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = false;  // no weight repacking
    llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", path); exit(1); }
    return model;
}

int main(int argc, char ** argv) {
    if (argc < 4) { fprintf(stderr, "usage: see source\n"); return 1; }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    std::string mode = argv[1];
    llama_model * model = load(argv[2]);
    const llama_vocab * vocab = llama_model_get_vocab(model);

    if (mode == "tokenize") {
        std::string buf = read_file(argv[3]);
        size_t p = 0;
        printf("add_bos %d bos %d eos %d n_vocab %d\n", (int) llama_vocab_get_add_bos(vocab), llama_vocab_bos(vocab),
               llama_vocab_eos(vocab), llama_vocab_n_tokens(vocab));
        while (p < buf.size()) {
            size_t nl = buf.find('\n', p);
            if (nl == std::string::npos) break;
            size_t n = std::stoul(buf.substr(p, nl - p));
            std::string text = buf.substr(nl + 1, n);
            p = nl + 1 + n + 1;
            print_ids("plain", tokenize(vocab, text, true, false));
            print_ids("special", tokenize(vocab, text, true, true));
        }
    } else if (mode == "gen") {
        if (argc < 7) { fprintf(stderr, "gen MODEL PROMPT_FILE N_GEN TOP_K THREADS\n"); return 1; }
        std::string prompt = read_file(argv[3]);
        int n_gen = atoi(argv[4]), top_k = atoi(argv[5]), threads = atoi(argv[6]);
        std::vector<llama_token> ids = tokenize(vocab, prompt, true, true);
        const int n_prompt = (int) ids.size();
        const int n_vocab = llama_vocab_n_tokens(vocab);
        print_ids("prompt", ids);

        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 4096;
        cp.n_batch = 4096;
        cp.n_ubatch = 512;
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        cp.no_perf = true;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) { fprintf(stderr, "cannot create context\n"); return 1; }

        // incremental greedy generation
        std::vector<llama_token> gen;
        std::vector<llama_token> cur = ids;
        llama_batch b = llama_batch_get_one(cur.data(), (int32_t) cur.size());
        if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
        for (int i = 0; i < n_gen; i++) {
            const float * lg = llama_get_logits_ith(ctx, -1);
            print_topk("step", i, lg, n_vocab, top_k);
            llama_token t = argmax(lg, n_vocab);
            gen.push_back(t);
            if (i + 1 == n_gen) break;
            llama_token one = t;
            b = llama_batch_get_one(&one, 1);
            if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
        }

        // teacher forced: one batch over prompt + gen[0..n_gen-2], logits at the last n_gen positions
        llama_memory_clear(llama_get_memory(ctx), true);
        std::vector<llama_token> all = ids;
        all.insert(all.end(), gen.begin(), gen.end() - 1);
        llama_batch bb = llama_batch_init((int32_t) all.size(), 0, 1);
        for (size_t j = 0; j < all.size(); j++) {
            bb.token[j] = all[j];
            bb.pos[j] = (llama_pos) j;
            bb.n_seq_id[j] = 1;
            bb.seq_id[j][0] = 0;
            bb.logits[j] = (int) j >= n_prompt - 1;
        }
        bb.n_tokens = (int32_t) all.size();
        if (llama_decode(ctx, bb)) { fprintf(stderr, "batched decode failed\n"); return 1; }
        for (int i = 0; i < n_gen; i++) {
            print_topk("tf", i, llama_get_logits_ith(ctx, n_prompt - 1 + i), n_vocab, top_k);
        }
        llama_batch_free(bb);
        llama_free(ctx);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode.c_str());
        return 1;
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
