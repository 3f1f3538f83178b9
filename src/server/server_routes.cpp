// One HTTP request: keep-alive, CORS, authentication, routing and the small endpoints.
#include "server_impl.h"


namespace kvboost {

using namespace server_detail;

void Server::Impl::send_error(HttpConn& c, const std::string& endpoint, const ApiError& e) {
  server::Headers h;
  if (e.status == 503) h.push_back({"Retry-After", "1"});
  if (e.status == 401) h.push_back({"WWW-Authenticate", "Bearer"});
  c.send_response(e.status, "application/json", server::error_body(e), h);
  count(endpoint, e.status);
}

void Server::Impl::send_json(HttpConn& c, const std::string& endpoint, int status, const ojson& body) {
  c.send_response(status, "application/json", json_text(body));
  count(endpoint, status);
}

// The tenant of the request: "anon" without keys, else the matching key's identity.
std::string Server::Impl::authenticate(const HttpRequest& r) {
  if (opt.api_keys.empty()) return "anon";
  const std::string auth = r.header("authorization");
  if (auth.empty())
    throw ApiError(401, "missing API key: send 'Authorization: Bearer <key>'", "", "missing_api_key");
  const std::string prefix = "Bearer ";
  if (auth.size() <= prefix.size() || auth.compare(0, prefix.size(), prefix) != 0)
    throw ApiError(401, "the Authorization header must be 'Bearer <key>'", "", "invalid_api_key");
  const std::string key = auth.substr(prefix.size());
  int match = -1;
  for (size_t i = 0; i < opt.api_keys.size(); ++i)
    if (same_secret(key, opt.api_keys[i])) match = int(i);
  if (match < 0) throw ApiError(401, "incorrect API key provided", "", "invalid_api_key");
  return "key" + std::to_string(match);
}

bool Server::Impl::origin_allowed(const std::string& origin) const {
  for (const std::string& o : opt.allowed_origins)
    if (o == "*" || o == origin) return true;
  return false;
}

// One complete request (the HTTP layer read it). Keep-alive while both sides want it (HTTP/1.1's
// default; HTTP/1.0 only with "Connection: keep-alive"); an idle connection is closed after
// keep_alive_s by the layer.
void Server::Impl::serve_request(HttpConn& c, HttpRequest& r) {
  {
    const std::string conn = lower_ascii(r.header("connection"));
    const bool ka = r.version == "HTTP/1.1" ? conn.find("close") == std::string::npos
                                            : conn.find("keep-alive") != std::string::npos;
    c.set_keep_alive(ka && opt.keep_alive_s > 0 && !draining);
  }
  // CORS (--allowed-origins): the allowed origin is echoed on every response to it.
  const std::string origin = r.header("origin");
  const bool cors = !origin.empty() && origin_allowed(origin);
  if (cors) c.set_extra_headers({{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}});
  if (r.method == "OPTIONS") {
    if (!origin.empty() && !cors) {
      send_error(c, "preflight", ApiError(403, "origin '" + origin + "' is not allowed (see --allowed-origins)", "",
                                          "origin_not_allowed"));
      return;
    }
    server::Headers h{{"Allow", "GET, POST, OPTIONS"}};
    if (cors) {
      const std::string req_headers = r.header("access-control-request-headers");
      h.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
      h.push_back({"Access-Control-Allow-Headers", req_headers.empty() ? "Authorization, Content-Type" : req_headers});
      h.push_back({"Access-Control-Max-Age", "600"});
    }
    c.send_response(204, "", "", h);
    count("preflight", 204);
    return;
  }
  const double t_arrival = now_ms();
  t_log = LogInfo{};
  const std::string& path = r.path;
  std::string endpoint = path;
  try {
    if (path == "/health") {
      if (r.method != "GET") throw ApiError(405, "use GET " + path, "", "method_not_allowed");
      ojson h;
      h["status"] = draining ? "shutting_down" : "ok";
      send_json(c, endpoint, draining ? 503 : 200, h);
      return;
    }
    struct Route {
      const char* path;
      const char* method;
    };
    static const Route routes[] = {{"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/warm", "POST"},
                                   {"/v1/models", "GET"},       {"/v1/stats", "GET"},             {"/metrics", "GET"},
                                   {"/tokenize", "POST"},       {"/detokenize", "POST"},          {"/v1/embeddings", "POST"}};
    const Route* route = nullptr;
    for (const Route& rt : routes)
      if (path == rt.path) route = &rt;
    const bool model_path = path.rfind("/v1/models/", 0) == 0;
    if (!route && !model_path) {
      endpoint = "unknown";
      throw ApiError(404, "no such endpoint: " + r.method + " " + path, "", "unknown_url");
    }
    if (model_path) endpoint = "/v1/models/{id}";
    const char* method = route ? route->method : "GET";
    if (r.method != method)
      throw ApiError(405, std::string("use ") + method + " " + path + " (got " + r.method + ")", "", "method_not_allowed");
    // --metrics-no-auth: /metrics without the API key (for a scraper on a private port).
    const std::string tenant = path == "/metrics" && opt.metrics_no_auth ? "anon" : authenticate(r);
    if (path == "/v1/models") {
      ojson list;
      list["object"] = "list";
      list["data"] = ojson::array({model_object()});
      send_json(c, endpoint, 200, list);
    } else if (model_path) {
      if (path.substr(11) != ctx.model_name)
        throw ApiError(404, "The model '" + path.substr(11) + "' does not exist", "model", "model_not_found");
      send_json(c, endpoint, 200, model_object());
    } else if (path == "/v1/stats") {
      send_json(c, endpoint, 200, stats_json());
    } else if (path == "/tokenize" || path == "/detokenize") {
      const ojson body = server::parse_body(r.body);
      send_json(c, endpoint, 200, path == "/tokenize" ? server::tokenize_json(body, ctx) : server::detokenize_json(body, ctx));
    } else if (path == "/v1/embeddings") {
      throw server::embeddings_error();
    } else if (path == "/metrics") {
      c.send_response(200, "text/plain; version=0.0.4; charset=utf-8", metrics_text());
      count(endpoint, 200);
    } else {
      const ojson body = server::parse_body(r.body);
      server::ParsedRequest p = path == "/v1/completions"        ? server::parse_completion(body, ctx)
                                : path == "/v1/chat/completions" ? server::parse_chat(body, ctx)
                                                                 : server::parse_warm(body, ctx);
      generate(c, endpoint, p, tenant, t_arrival, path == "/v1/warm");
    }
  } catch (const ApiError& e) {
    send_error(c, endpoint, e);
  } catch (const std::exception& e) {
    send_error(c, endpoint, ApiError(500, std::string("internal error: ") + e.what(), "", "internal_error"));
  }
  if (opt.log_requests)
    std::fprintf(stderr, "%s\n",
                 server::request_log_line(r.method, endpoint, t_log.status, t_log.prompt, t_log.cached, t_log.completion,
                                          t_log.ttft_ms, now_ms() - t_arrival)
                     .c_str());
}

ojson Server::Impl::model_object() const {
  ojson m;
  m["id"] = ctx.model_name;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "kvboost";
  m["max_model_len"] = ctx.context_length;
  return m;
}

}  // namespace kvboost
