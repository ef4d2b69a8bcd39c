/*
 * The oracle of tests/c/cudnn_graphs: the graph libh3 built through NVIDIA's cudnn-frontend before
 * cuda_sdpa_cudnn.cpp replaced it (the same calls as the former cuda_sdpa_cudnn.cu's build()), run
 * against the recording double of cuDNN (tests/c/fake_cudnn.c), so the double writes the frontend's
 * graph as a trace. Not built by CI (it needs the frontend's and cuDNN's headers); see
 * tests/c/cudnn_graphs/make_traces.sh.
 *
 * usage: cudnn_fe_oracle Lq Lk heads kv_heads D ldq ldk ldv ldo scale causal fp8 sm
 */
#include <cudnn_frontend.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstring>
namespace cudnn_frontend { void *cudnn_dlhandle = nullptr; }
namespace fe = cudnn_frontend;
int main(int argc, char **argv) {
    if (argc < 14) { fprintf(stderr, "usage\n"); return 2; }
    int64_t Lq = atoll(argv[1]), Lk = atoll(argv[2]), heads = atoll(argv[3]), kvh = atoll(argv[4]), D = atoll(argv[5]);
    int64_t ldq = atoll(argv[6]), ldk = atoll(argv[7]), ldv = atoll(argv[8]), ldo = atoll(argv[9]);
    float scale = atof(argv[10]); bool causal = atoi(argv[11]); bool fp8 = atoi(argv[12]); int sm = atoi(argv[13]);
    fe::cudnn_dlhandle = dlopen(getenv("H3_CUDNN_LIB"), RTLD_NOW | RTLD_LOCAL);
    if (!fe::cudnn_dlhandle) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    cudnnHandle_t handle; fe::detail::create_handle(&handle);
    const int64_t UID_Q = 1, UID_K = 2, UID_V = 3, UID_O = 4, UID_SCALE0 = 10, UID_AMAX_S = 20, UID_AMAX_O = 21;
    const fe::DataType_t io = fp8 ? fe::DataType_t::FP8_E4M3 : fe::DataType_t::BFLOAT16;
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
    g->set_sm_version(sm);
    g->set_cuda_graph_retention(fe::CudaGraphRetention_t::NONE);
    auto tensor = [&](const char *name, int64_t uid, int64_t h, int64_t L, int64_t ld) {
        return fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_data_type(io).set_dim({1, h, L, D}).set_stride({L * ld, D, ld, 1});
    };
    auto q = g->tensor(tensor("Q", UID_Q, heads, Lq, ldq));
    auto k = g->tensor(tensor("K", UID_K, kvh, Lk, ldk));
    auto v = g->tensor(tensor("V", UID_V, kvh, Lk, ldv));
    auto opt = fe::graph::SDPA_attributes().set_name("h3_sdpa").set_generate_stats(false).set_attn_scale(scale);
    if (causal) opt.set_diagonal_alignment(Lq == Lk ? fe::DiagonalAlignment_t::TOP_LEFT : fe::DiagonalAlignment_t::BOTTOM_RIGHT).set_diagonal_band_right_bound(0);
    std::shared_ptr<fe::graph::Tensor_attributes> o;
    if (fp8) {
        std::shared_ptr<fe::graph::Tensor_attributes> sc[6];
        static const char *const names[6] = {"descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"};
        for (int i = 0; i < 6; i++) sc[i] = g->tensor(fe::graph::Tensor_attributes().set_name(names[i]).set_uid(UID_SCALE0 + i).set_data_type(fe::DataType_t::FLOAT).set_dim({1,1,1,1}).set_stride({1,1,1,1}));
        auto outs = g->sdpa_fp8(q, k, v, sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], opt);
        o = outs[0];
        const int64_t amax_uid[2] = {UID_AMAX_S, UID_AMAX_O};
        for (int i = 0; i < 2; i++) if (outs[2 + i]) outs[2 + i]->set_output(true).set_uid(amax_uid[i]).set_data_type(fe::DataType_t::FLOAT).set_dim({1,1,1,1}).set_stride({1,1,1,1});
    } else o = g->sdpa(q, k, v, opt)[0];
    o->set_output(true).set_uid(UID_O).set_data_type(io).set_dim({1, heads, Lq, D}).set_stride({Lq * ldo, D, ldo, 1});
    int64_t ws = 0;
    auto chk = [](const char *s, fe::error_t r) { if (r.is_bad()) { printf("FAIL %s: %s\n", s, r.get_message().c_str()); return false; } return true; };
    if (!chk("validate", g->validate()) || !chk("bog", g->build_operation_graph(handle)) || !chk("cep", g->create_execution_plans({fe::HeurMode_t::A}))) return 1;
    g->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
    if (!chk("cs", g->check_support()) || !chk("bp", g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE)) || !chk("ws", g->get_workspace_size(ws))) return 1;
    printf("workspace %lld\n", (long long)ws);
    static char buf[1 << 16];
    std::unordered_map<int64_t, void *> pack = {{UID_Q, buf + 0x100}, {UID_K, buf + 0x200}, {UID_V, buf + 0x300}, {UID_O, buf + 0x400}};
    if (fp8) { for (int i = 0; i < 6; i++) pack[UID_SCALE0 + i] = buf + 0x1000 + 64 * i; pack[UID_AMAX_S] = buf + 0x2000; pack[UID_AMAX_O] = buf + 0x2010; }
    void *wsp = ws ? buf + 0x8000 : nullptr;
    fe::detail::set_stream(handle, (cudaStream_t)0x1234);
    if (!chk("exec", g->execute(handle, pack, wsp))) return 1;
    printf("ok\n");
    return 0;
}
