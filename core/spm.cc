/*
 * spm.cc - the C interface of spm.h over sentencepiece::SentencePieceProcessor.
 * Nothing here tokenizes: every answer is the library's. No exception
 * crosses into C.
 */
#include "spm.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

struct spm {
    sentencepiece::SentencePieceProcessor proc;
};

static void put_err(char *err, const std::string &msg)
{
    if (err) std::snprintf(err, 512, "%s", msg.c_str());
}

extern "C" spm *spm_load(const void *bytes, size_t n, char *err)
{
    try {
        spm *p = new spm;
        auto st = p->proc.LoadFromSerializedProto(absl::string_view(static_cast<const char *>(bytes), n));
        if (!st.ok()) {
            put_err(err, "the SentencePiece library refuses the tokenizer model: " + st.ToString());
            delete p;
            return nullptr;
        }
        if (p->proc.GetPieceSize() <= 0) {
            put_err(err, "the SentencePiece tokenizer model has no pieces");
            delete p;
            return nullptr;
        }
        return p;
    } catch (const std::exception &e) {
        put_err(err, std::string("the SentencePiece tokenizer model could not be loaded: ") + e.what());
        return nullptr;
    }
}

extern "C" void spm_free(spm *p) { delete p; }

extern "C" int spm_size(const spm *p) { return p->proc.GetPieceSize(); }

extern "C" size_t spm_id_to_piece(const spm *p, int id, char *buf, size_t cap)
{
    try {
        const std::string &s = p->proc.IdToPiece(id);
        if (cap) {
            size_t k = s.size() < cap - 1 ? s.size() : cap - 1;
            std::memcpy(buf, s.data(), k);
            buf[k] = 0;
        }
        return s.size();
    } catch (...) {
        if (cap) buf[0] = 0;
        return 0;
    }
}

extern "C" int spm_is_control(const spm *p, int id) { return p->proc.IsControl(id); }
extern "C" int spm_is_unknown(const spm *p, int id) { return p->proc.IsUnknown(id); }
extern "C" int spm_is_byte(const spm *p, int id) { return p->proc.IsByte(id); }

extern "C" long spm_encode(const spm *p, const char *text, size_t len, int32_t *ids, size_t *offs, size_t cap,
                           char *err)
{
    try {
        sentencepiece::ImmutableSentencePieceText spt;
        auto st = p->proc.Encode(absl::string_view(text, len), spt.mutable_proto());
        if (!st.ok()) {
            put_err(err, "the SentencePiece library could not encode the text: " + st.ToString());
            return -1;
        }
        const size_t n = spt.pieces_size();
        for (size_t i = 0; i < n && i < cap; i++) {
            auto piece = spt.pieces((int)i);
            ids[i] = (int32_t)piece.id();
            offs[i] = piece.begin() <= len ? piece.begin() : len;
        }
        return (long)n;
    } catch (const std::exception &e) {
        put_err(err, std::string("the SentencePiece library could not encode the text: ") + e.what());
        return -1;
    }
}

extern "C" long spm_decode(const spm *p, const int32_t *ids, int n, char *buf, size_t cap)
{
    try {
        std::vector<int> v(ids, ids + n);
        const int size = p->proc.GetPieceSize();
        for (int id : v)
            if (id < 0 || id >= size) return -1;
        std::string s;
        if (!p->proc.Decode(v, &s).ok()) return -1;
        if (cap) {
            size_t k = s.size() < cap - 1 ? s.size() : cap - 1;
            std::memcpy(buf, s.data(), k);
            buf[k] = 0;
        }
        return (long)s.size();
    } catch (...) {
        return -1;
    }
}
