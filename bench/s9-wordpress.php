<?php
// S9's WordPress: installs the site on the bench's private MariaDB and
// writes its heavy page, a post of 40 sections with 60 comments, rendered
// by the Twenty Twenty-Three theme on every request (no page cache).
// Prints the post's id. Usage: php s9-wordpress.php CONFIG-NAME
// (CONFIG-NAME: /etc/wordpress/config-CONFIG-NAME.php, as SetEnv
// WORDPRESS_CONFIG names it for httpd.)
$_SERVER['HTTP_HOST'] = '127.0.0.1';
$_SERVER['WORDPRESS_CONFIG'] = $argv[1];
define('WP_INSTALLING', true);
require '/usr/share/wordpress/wp-load.php';
require_once ABSPATH . 'wp-admin/includes/upgrade.php';
add_filter('pre_wp_mail', '__return_false');  // no mail about the new site
if (!is_blog_installed()) {
    wp_install('S9 bench', 'admin', 'admin@example.invalid', false, '', wp_generate_password());
}
// loadgen sends "Host: 127.0.0.1": the same host, so no canonical redirect
update_option('siteurl', 'http://127.0.0.1/wordpress');
update_option('home', 'http://127.0.0.1/wordpress');
$post = get_page_by_path('heavy', OBJECT, 'post');
if ($post) {
    echo $post->ID, "\n";
    exit;
}
$body = '';
for ($i = 0; $i < 40; $i++) {
    $body .= "<!-- wp:heading --><h2>Section $i</h2><!-- /wp:heading -->\n"
        . '<!-- wp:paragraph --><p>' . str_repeat('Lorem ipsum dolor sit amet, <em>consectetur</em> adipiscing elit. ', 12)
        . "</p><!-- /wp:paragraph -->\n"
        . "<!-- wp:list --><ul><li>one</li><li>two</li><li>three</li></ul><!-- /wp:list -->\n";
}
$id = wp_insert_post(['post_title' => 'Heavy', 'post_name' => 'heavy', 'post_content' => $body,
                      'post_status' => 'publish', 'post_author' => 1]);
for ($i = 0; $i < 60; $i++) {
    wp_insert_comment(['comment_post_ID' => $id, 'comment_author' => "reader $i",
                       'comment_content' => str_repeat('A comment with some words in it. ', 8),
                       'comment_approved' => 1]);
}
echo $id, "\n";
