// /docs: Swagger UI on the server's own OpenAPI document. With auth on, the document and
// "Try it out" send the key the dashboard keeps for this tab (entered on any /ui page).
"use strict";
(() => {
  const key = () => sessionStorage.getItem("orchestratord.key");
  window.ui = SwaggerUIBundle({
    url: document.body.dataset.openapi,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    validatorUrl: null, // the online validator would send the document to another host
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
    requestInterceptor: (request) => {
      const k = key();
      if (k && !request.headers.Authorization) request.headers.Authorization = `Bearer ${k}`;
      return request;
    },
  });
})();
