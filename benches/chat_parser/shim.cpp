// llama.cpp's own chat parser (common/chat.cpp, as llama-server uses it) on
// bmoe's recorded replies (tests/data/templates/recorded_calls.json): for
// each family, the template is applied with the conversation's tools to get
// llama.cpp's format and parser, the reply is parsed whole, and its calls
// are compared with the calls the reply holds. Prints one line per family:
// the file, llama.cpp's format, ok / differs / threw, and microseconds per
// parse. Built and run by run.sh beside the Rust parsers' timing.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "chat.h"

using json = nlohmann::ordered_json;

static std::string read(const std::string & path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

// The calls as [{name, arguments as JSON}], for comparing.
static json calls_of(const common_chat_msg & m) {
    json out = json::array();
    for (const auto & c : m.tool_calls) {
        json args = json::parse(c.arguments, nullptr, false);
        out.push_back({{"name", c.name}, {"arguments", args}});
    }
    return out;
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s TEMPLATES_DIR REPEATS\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    const int repeats = std::stoi(argv[2]);
    json recorded = json::parse(read(dir + "/recorded_calls.json"));
    json manifest = json::parse(read(dir + "/manifest.json"));
    json tools = json::parse(read(dir + "/conversations.json"))["tools"];
    int ok = 0, n = 0;
    for (const auto & r : recorded["replies"]) {
        n++;
        std::string file = r["file"], bos, eos;
        for (const auto & e : manifest["templates"]) {
            if (e["file"] == file) {
                bos = e["bos"];
                eos = e["eos"];
            }
        }
        std::string verdict = "ok", format = "-";
        double us = 0;
        try {
            auto tmpls = common_chat_templates_init(nullptr, read(dir + "/" + file), bos, eos);
            common_chat_templates_inputs in;
            common_chat_msg user;
            user.role = "user";
            user.content = "What's the weather in Paris and Tokyo?";
            in.messages = {user};
            for (const auto & t : tools) {
                in.tools.push_back({t["function"]["name"], t["function"]["description"],
                                    t["function"]["parameters"].dump()});
            }
            in.parallel_tool_calls = true;
            common_chat_params params = common_chat_templates_apply(tmpls.get(), in);
            format = common_chat_format_name(params.format);
            common_chat_parser_params pp(params);
            if (!params.parser.empty()) {
                pp.parser.load(params.parser);
            }
            const std::string reply = r["reply"];
            common_chat_msg m = common_chat_parse(reply, false, pp);
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < repeats; i++) {
                m = common_chat_parse(reply, false, pp);
            }
            auto dt = std::chrono::steady_clock::now() - t0;
            us = std::chrono::duration<double, std::micro>(dt).count() / repeats;
            if (calls_of(m) != r["calls"]) {
                verdict = "differs: " + calls_of(m).dump();
            }
        } catch (const std::exception & e) {
            verdict = std::string("threw: ") + e.what();
        }
        ok += verdict == "ok";
        printf("%-52s %-22s %8.1f us  %s\n", file.c_str(), format.c_str(), us, verdict.substr(0, 160).c_str());
    }
    printf("llama.cpp common_chat_parse: %d of %d families' calls parsed back\n", ok, n);
    return 0;
}
